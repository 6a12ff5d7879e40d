package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kvgate/kvgate/internal/relayd"
	"github.com/kvgate/kvgate/kvevents/relay"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/membership"
)

// runRelay is `kvgate relay`: flags → relay.Config → relayd.Serve.
func runRelay(ctx context.Context, args []string) error {
	var cfg relay.Config
	var sc relayd.ServeConfig
	w := &cfg.Worker
	w.Role = membership.RoleAggregated
	fs := config.NewFlagSet("relay", os.Stderr)
	zmq := fs.String("zmq", "tcp://127.0.0.1:5557", "the engine's ZMQ PUB endpoint (vLLM --kv-events-config endpoint); comma-separated, one per data-parallel rank")
	replay := fs.String("zmq-replay", "", "the engine's replay endpoints (vLLM replay_endpoint), aligned with -zmq: lost messages are fetched from there")
	fs.StringVar(&cfg.Topic, "topic", "", "ZMQ topic prefix to subscribe to (empty: all)")
	fs.StringVar(&cfg.Pool, "pool", "default", "pool the engine belongs to")
	fs.StringVar(&w.ID, "worker-id", "", "worker id of the engine (required)")
	fs.StringVar(&w.Address, "address", "", "engine HTTP host:port to register in etcd (empty: do not register)")
	fs.IntVar(&w.BlockSize, "block-size", 16, "the pool's KV block size; blocks of other sizes are skipped")
	fs.StringVar(&w.Model, "model", "", "model the engine serves (registered)")
	fs.Var(&w.Role, "role", "aggregated, prefill or decode (registered)")
	fs.IntVar(&w.DPSize, "dp-size", 1, "data-parallel ranks of the engine (registered)")
	fs.IntVar(&w.KVCapacityBlocks, "kv-capacity-blocks", 0, "engine KV cache size in blocks (registered; 0 unknown)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 0, "etcd lease TTL (default 10s)")
	fs.StringVar(&sc.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS server")
	sc.NATSTLS.Flags(fs, "nats", "the NATS servers", false)
	fs.StringVar(&sc.NATSCredsFile, "nats-creds-file", "", "NATS credentials file (JWT and NKey seed)")
	etcd := fs.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints (used with -address)")
	sc.EtcdTLS.Flags(fs, "etcd", "etcd", false)
	fs.Var(config.Listen(&sc.MetricsAddr), "admin-addr", "admin HTTP listen address: Prometheus /metrics (empty: none; a port alone is loopback)")
	fs.Alias("metrics-addr", "admin-addr")
	loraIDs := fs.String("lora-ids", "", "adapter names of engine lora ids, for engines that send lora_id without lora_name: id=name,… (vLLM's integer ids, SGLang's string ids)")
	var logging config.Logging
	logging.Flags(fs, "info")
	if err := fs.Parse(args, os.Getenv); err != nil {
		return err
	}
	if w.ID == "" {
		return errors.New("-worker-id is required")
	}
	log, err := logging.Logger(os.Stderr)
	if err != nil {
		return err
	}
	for _, kv := range config.SplitList(*loraIDs) {
		id, name, ok := strings.Cut(kv, "=")
		if !ok || id == "" || name == "" {
			return fmt.Errorf("-lora-ids %q: want id=name", kv)
		}
		if cfg.LoRANames == nil {
			cfg.LoRANames = map[string]string{}
		}
		cfg.LoRANames[id] = name
	}
	cfg.Endpoints = config.SplitList(*zmq)
	cfg.ReplayEndpoints = strings.Split(*replay, ",")
	if *replay == "" {
		cfg.ReplayEndpoints = nil
	}
	cfg.Register = w.Address != ""
	sc.EtcdEndpoints = config.SplitList(*etcd)
	return relayd.Serve(ctx, cfg, sc, log)
}
