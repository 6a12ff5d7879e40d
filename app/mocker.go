package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/mockerd"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/tokenizer"
)

// runMocker is `kvgate mocker`: flags → mockerd.RunConfig → mockerd.Run.
func runMocker(ctx context.Context, args []string) error {
	cfg, log, err := parseMocker(args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	return mockerd.Run(ctx, cfg, mockerd.RunDeps{Logger: log})
}

// parseMocker is the mocker args and the environment (getenv) ask for,
// and its logger; the usage and the warnings go to out.
func parseMocker(args []string, getenv func(string) string, out io.Writer) (mockerd.RunConfig, *slog.Logger, error) {
	var cfg mockerd.RunConfig
	fail := func(err error) (mockerd.RunConfig, *slog.Logger, error) { return mockerd.RunConfig{}, nil, err }
	e := &cfg.Server.Engine
	e.Role = membership.RoleAggregated
	fs := config.NewFlagSet("mocker", out)
	cfg.Listen = "127.0.0.1:8001"
	fs.Var(config.Listen(&cfg.Listen), "addr", "HTTP listen address (a port alone is loopback; 0.0.0.0:8001 for every interface)")
	fs.Var(listenPart(&cfg.Listen, false), "host", "HTTP listen host")
	fs.MarkDeprecated("host", "-addr")
	fs.Var(listenPart(&cfg.Listen, true), "port", "HTTP listen port")
	fs.MarkDeprecated("port", "-addr")
	fs.StringVar(&cfg.Advertise, "advertise-addr", "", "host:port registered in etcd, and the prefill role's side channel (default: the listen address)")
	fs.Deprecated("advertise", "advertise-addr")
	fs.StringVar(&cfg.Server.Model, "model", "mock-model", "served model name")
	loras := fs.String("lora", "", "comma-separated LoRA adapter names also served")
	fs.IntVar(&e.BlockSize, "block-size", 16, "KV block size in tokens")
	fs.IntVar(&e.NumBlocks, "num-blocks", 8192, "KV cache size in blocks")
	fs.IntVar(&e.CPUBlocks, "cpu-blocks", 0, "CPU KV tier in blocks (0: none): GPU evictions offload there (medium CPU events), hits reload")
	fs.Float64Var(&e.CPUReloadBandwidth, "cpu-reload-bandwidth", 25e9, "CPU→GPU reload bandwidth in bytes/s (read with -cpu-blocks)")
	fs.IntVar(&e.MaxNumSeqs, "max-num-seqs", 256, "maximum running sequences")
	fs.IntVar(&e.MaxNumBatchedTokens, "max-num-batched-tokens", 8192, "maximum tokens per iteration (chunked prefill)")
	fs.BoolVar(&e.DisablePrefixCaching, "no-prefix-caching", false, "disable prefix caching (and KV events)")
	fs.Float64Var(&e.Speedup, "speedup", 1, "divide the timing model's durations by this factor")
	fs.Var(&e.Role, "role", "aggregated, prefill or decode")
	fs.Float64Var(&e.KVBytesPerToken, "kv-bytes-per-token", 131072, "KV bytes per token: the decode role's transfer time and the CPU tier's reload time")
	fs.Float64Var(&e.KVTransferBandwidth, "kv-transfer-bandwidth", 25e9, "decode role: prefill→decode KV bandwidth in bytes/s")
	fs.DurationVar(&cfg.Server.PrefillTimeout, "prefill-timeout", mocker.DefaultPrefillTimeout, "decode role: bound on the prefill hop to x-prefiller-host-port and the KV pull (504 past it)")
	fs.DurationVar(&e.KVHoldTimeout, "kv-hold-timeout", 480*time.Second, "prefill role: how long a do_remote_decode request's blocks stay pinned if no decode worker pulls them (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	fs.IntVar(&cfg.Server.DefaultMaxTokens, "default-max-tokens", 16, "max_tokens of requests that set none")
	fs.IntVar(&cfg.Server.DPSize, "dp-size", 1, "data-parallel ranks, each with its own KV cache (X-Data-Parallel-Rank or routed_dp_rank picks one); events=zmq binds one PUB socket per rank at --zmq-endpoint's port + rank, as vLLM does")
	fs.Int64Var(&cfg.Server.MaxBodyBytes, "max-body-bytes", mocker.DefaultMaxBodyBytes, "largest request body accepted (413 past it); keep it equal to the router's max_body_bytes for the model")
	fs.IntVar(&cfg.Server.MaxModelLen, "max-model-len", 0, "context length in tokens: prompt + max_tokens past it is a 400 (default: num-blocks × block-size)")
	fs.StringVar(&cfg.Events, "events", mockerd.EventsZMQ, "KV events: zmq (vLLM format, for kvgate relay), nats (direct), none")
	fs.StringVar(&cfg.ZMQEndpoint, "zmq-endpoint", config.DefaultMockerZMQEndpoint, "ZMQ PUB bind endpoint (events=zmq; tcp://*:5557 for every interface)")
	fs.StringVar(&cfg.ZMQTopic, "zmq-topic", "kv-events", "ZMQ topic (events=zmq)")
	fs.StringVar(&cfg.ZMQReplayEndpoint, "zmq-replay-endpoint", "", "serve vLLM's replay socket here, e.g. tcp://*:5558 (events=zmq)")
	fs.StringVar(&cfg.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS server (events=nats)")
	cfg.NATSTLS.Flags(fs, "nats", "the NATS servers", false)
	fs.StringVar(&cfg.NATSCredsFile, "nats-creds-file", "", "NATS credentials file (JWT and NKey seed)")
	etcd := fs.String("etcd", "", "comma-separated etcd endpoints: register this worker (empty: do not)")
	cfg.EtcdTLS.Flags(fs, "etcd", "etcd", false)
	fs.StringVar(&cfg.Pool, "pool", "default", "pool the worker belongs to")
	fs.StringVar(&cfg.WorkerID, "worker-id", "", "worker id (default mocker-<port>)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 0, "etcd lease TTL (default 10s)")
	tokBackend := fs.String("tokenizer", tokenizer.BackendOpenAI, "tokenizer: openai (with -encoding), huggingface (with -tokenizer-dir) or word (the built-in word tokenizer); use the router's, so both compute the same token ids")
	tokDir := fs.String("tokenizer-dir", "", "model folder with tokenizer.json and tokenizer_config.json (-tokenizer huggingface)")
	encoding := fs.String("encoding", "cl100k_base", "OpenAI encoding (-tokenizer openai): cl100k_base or o200k_base")
	var logging config.Logging
	logging.Flags(fs, "info")
	if err := fs.Parse(args, getenv); err != nil {
		return fail(err)
	}
	log, err := logging.Logger(out)
	if err != nil {
		return fail(err)
	}
	if cfg.Server.Tokenizer, err = mockerTokenizer(*tokBackend, *tokDir, *encoding, cfg.Server.Model, log); err != nil {
		return fail(err)
	}
	cfg.Server.LoRAs = config.SplitList(*loras)
	cfg.EtcdEndpoints = config.SplitList(*etcd)
	warnMockerNotRead(fs, cfg, *tokBackend)
	return cfg, log, nil
}

// warnMockerNotRead warns about the mocker's flags given (on the command
// line or from the environment) that the configuration they sit in does
// not read: another role's, another events mode's, another tokenizer's,
// the registration's without -etcd. A warning, not a refusal: one set of
// flags for every worker of a deployment is common, and harmless.
func warnMockerNotRead(fs *config.FlagSet, cfg mockerd.RunConfig, backend string) {
	e := cfg.Server.Engine
	if e.Role != membership.RolePrefill {
		fs.WarnNotRead(fmt.Sprintf("read by -role prefill only (this is -role %s)", e.Role), "kv-hold-timeout")
	}
	if e.Role != membership.RoleDecode {
		fs.WarnNotRead(fmt.Sprintf("read by -role decode only (this is -role %s)", e.Role), "prefill-timeout", "kv-transfer-bandwidth")
	}
	if e.Role != membership.RoleDecode && e.CPUBlocks == 0 {
		fs.WarnNotRead("read by -role decode (the transfer time) and -cpu-blocks (the reload time) only", "kv-bytes-per-token")
	}
	if e.CPUBlocks == 0 {
		fs.WarnNotRead("read with a CPU tier only (-cpu-blocks 0: none)", "cpu-reload-bandwidth")
	}
	if cfg.Events != mockerd.EventsZMQ {
		fs.WarnNotRead(fmt.Sprintf("read by -events zmq only (this is -events %s)", cfg.Events), "zmq-endpoint", "zmq-topic", "zmq-replay-endpoint")
	}
	if cfg.Events != mockerd.EventsNATS {
		fs.WarnNotRead(fmt.Sprintf("read by -events nats only (this is -events %s)", cfg.Events), "nats-url", "nats-ca-file", "nats-cert-file", "nats-key-file", "nats-creds-file")
	}
	if len(cfg.EtcdEndpoints) == 0 {
		fs.WarnNotRead("read by the etcd registration only (no -etcd)", "lease-ttl", "etcd-ca-file", "etcd-cert-file", "etcd-key-file")
		if e.Role != membership.RolePrefill {
			fs.WarnNotRead("read by the etcd registration (no -etcd) and the prefill role's side channel (this is -role "+string(e.Role)+") only", "advertise-addr")
		}
	}
	if backend != tokenizer.BackendOpenAI {
		fs.WarnNotRead("read by -tokenizer openai only", "encoding")
	}
	if backend != tokenizer.BackendHuggingFace {
		fs.WarnNotRead("read by -tokenizer huggingface only", "tokenizer-dir")
	}
}

// listenPart is the deprecated -host (port false) or -port flag: it sets
// that part of the -addr value at p.
func listenPart(p *string, port bool) *config.Value {
	return &config.Value{
		Kind: map[bool]string{false: "string", true: "int"}[port],
		SetFunc: func(v string) error {
			h, pt, err := net.SplitHostPort(*p)
			if err != nil {
				return err
			}
			if port {
				if _, err := strconv.ParseUint(v, 10, 16); err != nil {
					return errors.New("not a port number")
				}
				pt = v
			} else {
				h = v
			}
			*p = net.JoinHostPort(h, pt)
			return nil
		},
		GetFunc: func() string { return "" },
	}
}

// mockerTokenizer is the tokenizer the mocker's flags name, configured as
// the router configures a model's (tokenizer.Config).
func mockerTokenizer(backend, dir, encoding, model string, log *slog.Logger) (mocker.Tokenizer, error) {
	switch backend {
	case "word":
		return mocker.WordTokenizer{}, nil
	case tokenizer.BackendOpenAI:
		return tokenizer.Load(tokenizer.Config{Model: model, Backend: backend, Encoding: encoding, Logger: log})
	case tokenizer.BackendHuggingFace:
		if dir == "" {
			return nil, fmt.Errorf("-tokenizer huggingface needs -tokenizer-dir")
		}
		return tokenizer.Load(tokenizer.Config{Model: model, Backend: backend, Path: dir, Logger: log})
	}
	return nil, fmt.Errorf("-tokenizer %q: want openai, huggingface or word", backend)
}
