package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/kvgate/kvgate/internal/relayd"
	"github.com/kvgate/kvgate/kvevents/relay"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/membership"
)

// runRelay is `kvgate relay`: flags → relay.Config → relayd.Serve.
func runRelay(ctx context.Context, args []string) error {
	cfg, sc, log, err := parseRelay(args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	return relayd.Serve(ctx, cfg, sc, log)
}

// parseRelay is the relay args and the environment (getenv) ask for,
// and its logger; the usage and the warnings go to out.
func parseRelay(args []string, getenv func(string) string, out io.Writer) (relay.Config, relayd.ServeConfig, *slog.Logger, error) {
	var cfg relay.Config
	var sc relayd.ServeConfig
	fail := func(err error) (relay.Config, relayd.ServeConfig, *slog.Logger, error) {
		return relay.Config{}, relayd.ServeConfig{}, nil, err
	}
	w := &cfg.Worker
	w.Role = membership.RoleAggregated
	fs := config.NewFlagSet("relay", out)
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
	if err := fs.Parse(args, getenv); err != nil {
		return fail(err)
	}
	if w.ID == "" {
		return fail(errors.New("-worker-id is required"))
	}
	log, err := logging.Logger(out)
	if err != nil {
		return fail(err)
	}
	for _, kv := range config.SplitList(*loraIDs) {
		id, name, ok := strings.Cut(kv, "=")
		if !ok || id == "" || name == "" {
			return fail(fmt.Errorf("-lora-ids %q: want id=name", kv))
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
	if !cfg.Register {
		// Harmless to keep (one set of flags for every engine's relay),
		// but not read: warned about.
		fs.WarnNotRead("read by the engine's etcd registration only, made with -address", "model", "role", "dp-size", "kv-capacity-blocks",
			"lease-ttl", "etcd", "etcd-ca-file", "etcd-cert-file", "etcd-key-file")
	}
	return cfg, sc, log, nil
}
