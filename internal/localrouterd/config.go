package localrouterd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/tlsconfig"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter"
)

// Config is the configuration of one local-router process.
type Config struct {
	// Pool is the pool this router serves (required).
	Pool string
	// RouterID names this replica in etcd and in replica sync (default:
	// hostname and a random suffix).
	RouterID string
	// GRPCAddr is the gRPC listen address.
	GRPCAddr string
	// AdvertiseAddr is the gRPC address registered in etcd (default: the
	// listener's address, with the hostname when it listens on all
	// interfaces).
	AdvertiseAddr string
	// MetricsAddr is the admin HTTP listen address (-admin-addr, alias
	// -metrics-addr): /metrics ("" disables). Loopback by default.
	MetricsAddr string
	// HealthAddr serves the gRPC health service alone, in plaintext, for
	// kubelet gRPC probes that cannot do TLS ("" disables).
	HealthAddr string
	// TLS of the gRPC server (off unless set).
	TLS tlsconfig.Server
	// AuthorizedClients, under mutual TLS, are the certificate names
	// (tlsconfig.PeerNames: its SANs, the CN only without them) allowed to make lifecycle calls (Commit, Track, Free,
	// MarkPrefillComplete, DumpEvents). Empty: any client whose
	// certificate the client CA verified.
	AuthorizedClients []string
	// AnonymousCommitExpiry frees a request recorded by a unary call
	// (Commit, BestWorker with request_id) after this long unless freed
	// before, on a router without mutual TLS (anonexpiry.go). 0:
	// DefaultAnonymousCommitExpiry; negative: off (the router's
	// request_expiry alone).
	AnonymousCommitExpiry time.Duration
	// Etcd endpoints (required).
	Etcd []string
	// EtcdTLS is the etcd client's TLS.
	EtcdTLS tlsconfig.Client
	// Log is -log-level and -log-format (the process's logger; JSON
	// lines at info by default).
	Log config.Logging
	// NATS URL (required when the router uses KV events or replica sync).
	NATS string
	// NATSTLS and NATSCredsFile secure the NATS client.
	NATSTLS       tlsconfig.Client
	NATSCredsFile string
	// RegisterTTL is the lease TTL of the router's etcd registration.
	RegisterTTL time.Duration
	// MetricsPeriod is how often each worker's engine metrics endpoint is
	// scraped (localrouter/signals; 0 disables, the default).
	MetricsPeriod time.Duration
	// PoolsFile is the global router's configuration file (the pools file
	// kvgate extproc reads, e.g. the same ConfigMap mounted): when set, the
	// router takes Pool's worker_chain from it, and refuses a block size
	// other than the pool's there (ParseFlags).
	PoolsFile string
	// Router is the router's own configuration.
	Router localrouter.Config
}

// DefaultConfig returns the defaults of every flag: Config{}.Defaults().
func DefaultConfig() Config { return Config{}.Defaults() }

// Defaults returns c with every unset field set to its default. The
// listeners bind loopback unless told otherwise.
func (c Config) Defaults() Config {
	if c.GRPCAddr == "" {
		c.GRPCAddr = config.DefaultLocalRouterAddr
	}
	if c.MetricsAddr == "" {
		c.MetricsAddr = config.DefaultLocalRouterAdminAddr
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Log.Format == "" {
		c.Log.Format = config.LogJSON
	}
	if c.RegisterTTL == 0 {
		c.RegisterTTL = 10 * time.Second
	}
	if c.AnonymousCommitExpiry == 0 {
		c.AnonymousCommitExpiry = DefaultAnonymousCommitExpiry
	}
	if reflect.ValueOf(c.Router).IsZero() {
		c.Router = localrouter.DefaultConfig()
	}
	return c
}

// Validate checks what ParseFlags cannot check field by field.
func (c Config) Validate() error {
	switch {
	case c.Pool == "":
		return errors.New("--pool (KVGATE_POOL) is required")
	case strings.ContainsAny(c.Pool, "/. *>"):
		return fmt.Errorf("--pool %q: must not contain '/', '.', ' ', '*' or '>'", c.Pool)
	case len(c.Etcd) == 0:
		return errors.New("--etcd (KVGATE_ETCD) is required")
	case c.NATS == "" && (c.Router.UseKVEvents || c.Router.ReplicaSync):
		return errors.New("--nats-url (KVGATE_NATS_URL) is required unless --router-use-kv-events=false and --router-replica-sync=false")
	case c.RouterID == "" || strings.ContainsAny(c.RouterID, "/ "):
		return fmt.Errorf("--router-id %q: must be non-empty without '/' or ' '", c.RouterID)
	case c.RegisterTTL < time.Second:
		return fmt.Errorf("--register-ttl %v: must be at least 1s", c.RegisterTTL)
	case len(c.AuthorizedClients) > 0 && !c.TLS.MutualTLS():
		return errors.New("-authorized-clients needs mutual TLS: set -tls-client-ca-file")
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if err := c.Log.Validate(); err != nil {
		return err
	}
	return c.Router.Validate()
}

// flags defines the configuration's flags on fs, bound to c. Each flag
// -foo-bar is also read from KVGATE_FOO_BAR (lib/config); the router
// knobs also take Dynamo's variable names, with a lower precedence.
func flags(fs *config.FlagSet, c *Config) {
	r := &c.Router
	fs.Var(config.String(&c.Pool), "pool", "pool this router serves (required)")
	fs.Var(config.String(&c.RouterID), "router-id", "this replica's id (default: hostname-random)")
	fs.Var(config.Listen(&c.GRPCAddr), "addr", "gRPC listen address")
	fs.Deprecated("grpc-addr", "addr")
	fs.Var(config.String(&c.AdvertiseAddr), "advertise-addr", "gRPC address registered in etcd (default: the listen address)")
	fs.Var(config.Listen(&c.MetricsAddr), "admin-addr", "admin HTTP listen address: /metrics (empty: none)")
	fs.Alias("metrics-addr", "admin-addr")
	fs.Var(config.Listen(&c.HealthAddr), "health-addr", "plaintext gRPC health server address, for probes that cannot do TLS (empty: none)")
	c.TLS.Flags(fs)
	fs.Var(config.List(&c.AuthorizedClients), "authorized-clients", "under mutual TLS, comma-separated client certificate names (DNS or URI SANs; the CN only when there is no SAN) allowed lifecycle calls (Commit, Track, Free, MarkPrefillComplete, DumpEvents); empty: any verified client")
	fs.Var(config.SignedDuration(&c.AnonymousCommitExpiry), "anonymous-commit-expiry", fmt.Sprintf("without mutual TLS (anyone reaching the port may commit), a request recorded by a unary Commit or BestWorker with request_id is freed after this long unless freed before (requests on a Channel or Track stream end with their stream; 0: %v; negative: off, only the router's request_expiry); under mutual TLS not read (warned)", DefaultAnonymousCommitExpiry))
	fs.Var(config.List(&c.Etcd), "etcd", "etcd endpoints, comma-separated (required)")
	c.EtcdTLS.Flags(fs, "etcd", "etcd", false)
	fs.Var(config.String(&c.NATS), "nats-url", "NATS URL (required with KV events or replica sync)")
	fs.Deprecated("nats", "nats-url")
	c.NATSTLS.Flags(fs, "nats", "the NATS servers", false)
	fs.StringVar(&c.NATSCredsFile, "nats-creds-file", c.NATSCredsFile, "NATS credentials file (JWT and NKey seed)")
	fs.Var(config.Duration(&c.RegisterTTL), "register-ttl", "lease TTL of the router's etcd registration")
	c.Log.Flags(fs, "info")

	fs.Var(config.Int(&r.BlockSize, 1), "block-size", "KV block size in tokens")
	fs.Alias("router-block-size", "block-size")
	fs.Env("block-size", "DYN_KV_CACHE_BLOCK_SIZE")
	fs.Var(config.Float(&r.OverlapScoreCredit), "router-overlap-score-credit", "weight of cached blocks against prefill work; read by the cost worker-chain scorer only (not by the default chain saturation,ttft: set, it is warned about)")
	fs.Env("router-overlap-score-credit", "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT")
	fs.Var(config.Float(&r.PrefillLoadScale), "router-prefill-load-scale", "weight of prefill work against decode load; read by the cost worker-chain scorer only (not by the default chain saturation,ttft: set, it is warned about)")
	fs.Env("router-prefill-load-scale", "DYN_ROUTER_PREFILL_LOAD_SCALE")
	fs.Var(config.Float(&r.RouterTemperature), "router-temperature", "0 picks the cheapest worker; > 0 samples a softmax over costs")
	fs.Env("router-temperature", "DYN_ROUTER_TEMPERATURE")
	fs.Var(config.Bool(&r.UseKVEvents), "router-use-kv-events", "index from engine KV events (false: approximate index from the router's decisions)")
	fs.Var(config.Bool(&r.TrackActiveBlocks), "router-track-active-blocks", "count active decode blocks in the cost; read by the cost worker-chain scorer only (not by the default chain: false is warned about)")
	fs.Var(config.Bool(&r.ReplicaSync), "router-replica-sync", "share request lifecycle with the pool's other router replicas")
	fs.Var(config.Duration(&r.TTL), "router-ttl", "TTL of approximate-index entries (duration, or seconds)")
	fs.Var(config.DurationOrZero(&r.PredictedTTL), "router-predicted-ttl", "with KV events, how long a placed request's blocks stay predicted on its worker until the engine's events confirm them (duration, or seconds; 0: none)")
	fs.Var(config.Bool(&r.Calibrate), "router-calibrate", "fit each worker rank's timing model online from the first tokens the router observes (false: the configured curves for every rank); read by the ttft worker-chain scorer, and by the prediction reported as Selection.Cost whatever the chain (docs/localrouter.md, Calibration)")
	fs.Var(config.Int(&r.MaxTreeSize, 1), "router-max-tree-size", "bound on approximate-index entries (-router-use-kv-events=false), and on predicted entries (with KV events and -router-predicted-ttl); past it the oldest are pruned")
	fs.Var(config.Int(&r.MinInitialWorkers, 0), "min-initial-workers", "not ready (health NOT_SERVING, UNAVAILABLE) until this many workers joined")
	fs.Alias("router-min-initial-workers", "min-initial-workers")
	fs.Env("min-initial-workers", "DYN_ROUTER_MIN_INITIAL_WORKERS")
	fs.Var(config.DurationOrZero(&c.MetricsPeriod), "router-metrics-period", "scrape each worker's engine metrics (vLLM/SGLang /metrics) this often (duration, or seconds; 0 disables)")
	fs.Var(config.Float(&r.WaitingWeight), "router-waiting-weight", "cost in blocks per request waiting in the engine's queue (0: unused); read by the cost worker-chain scorer only, where engine metrics are scraped (-router-metrics-period); otherwise set, it is warned about")
	fs.Var(config.Float(&r.KVUsageWeight), "router-kv-usage-weight", "cost in blocks of a full engine KV cache, proportionally below (0: unused); read by the cost worker-chain scorer only, where engine metrics are scraped (-router-metrics-period); otherwise set, it is warned about")
	fs.Var(config.Float(&r.SaturationKVUsage), "router-saturation-kv-usage", "skip a rank whose engine reports KV usage at least this (0..1) with requests waiting (0 disables); read by the saturation worker-chain filter, where engine metrics are scraped")
	fs.Var(config.Int(&r.SaturationWaiting, 0), "router-saturation-waiting", "skip a rank whose engine reports this many waiting requests or more (0 disables); read by the saturation worker-chain filter, where engine metrics are scraped")
	fs.Var(&config.Value{
		SetFunc: func(v string) error {
			w, err := localrouter.ParseTierWeights(v)
			if err == nil {
				r.TierWeights = w
			}
			return err
		},
		GetFunc: func() string { return localrouter.FormatTierWeights(r.TierWeights) },
	}, "router-tier-weights", "credit of a cached block per lower cache tier, relative to the GPU (tier=weight,…; none: ignore offloaded blocks)")
	fs.Var(config.String(&c.PoolsFile), "pools-file", "the global router's configuration file (kvgate extproc -config, e.g. the same ConfigMap): take -pool's worker_chain from it (exclusive with -worker-chain) and check -block-size against the pool's")
	fs.Var(&config.Value{
		SetFunc: func(v string) error {
			specs, err := localrouter.LoadWorkerChain(v, *r)
			if err == nil {
				r.WorkerChain = specs
			}
			return err
		},
		GetFunc: func() string { return localrouter.FormatWorkerChain(r.WorkerChain) },
	}, "worker-chain", "how workers are ranked: filters and weighted scorers inline (saturation,cost=1,prefix=2,cold=1/lru_size=512) or a YAML file (FILE.yaml, or @FILE) listing {name, weight, args}; empty: saturation then ttft, the predicted-TTFT scorer; cost (or saturation,cost) for Dynamo's cost (docs/localrouter.md, Worker chain)")
	fs.Var(config.Duration(&r.RequestExpiry), "router-request-expiry", "free requests still active after this long (duration, or seconds)")
}

// ParseFlags builds a Config from the defaults, then the environment (read
// with getenv; Dynamo's names are aliases that kvgate's override), then the
// command-line flags. Every error names the flag or variable at fault.
// -h returns flag.ErrHelp after printing the usage to usage.
func ParseFlags(name string, args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	return ParseFlagsWith(name, args, getenv, usage, nil)
}

// ParseFlagsWith is ParseFlags with the worker chain's filters and scorers
// taken from scorers (nil: the built-ins; Config.Router.Scorers).
func ParseFlagsWith(name string, args []string, getenv func(string) string, usage io.Writer, scorers *localrouter.ScorerRegistry) (Config, error) {
	c := DefaultConfig()
	c.Router.Scorers = scorers
	fs := config.NewFlagSet(name, usage)
	flags(fs, &c)
	if err := fs.Parse(args, getenv); err != nil {
		return Config{}, err
	}
	if c.RouterID == "" {
		c.RouterID = defaultRouterID()
	}
	if c.AnonymousCommitExpiry == 0 {
		c.AnonymousCommitExpiry = DefaultAnonymousCommitExpiry
	}
	if c.TLS.MutualTLS() {
		fs.WarnNotRead("the callers are identified by mutual TLS (-tls-client-ca-file): no commit is anonymous", "anonymous-commit-expiry")
	}
	if !c.Router.UseKVEvents && !c.Router.ReplicaSync {
		fs.WarnNotRead("NATS carries the KV events (-router-use-kv-events) and the replica sync (-router-replica-sync), both off here", "nats-url")
	}
	if c.NATS == "" {
		fs.WarnNotRead("read by the NATS client only, and there is no -nats-url", "nats-ca-file", "nats-cert-file", "nats-key-file", "nats-creds-file")
	}
	if err := c.applyPoolsFile(); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// applyPoolsFile takes the pool's worker_chain from PoolsFile (when set):
// the one chain a deployment configures for the pool, in the file the
// global router reads too. A -worker-chain as well, or a block size other
// than the pool's, is refused: two answers to one question.
func (c *Config) applyPoolsFile() error {
	if c.PoolsFile == "" {
		return nil
	}
	if c.Pool == "" {
		return errors.New("-pools-file: -pool names the pool to read")
	}
	specs, bs, err := localrouter.LoadPoolWorkerChain(c.PoolsFile, c.Pool, c.Router)
	if err != nil {
		return fmt.Errorf("-pools-file: %w", err)
	}
	if bs != c.Router.BlockSize {
		return fmt.Errorf("-pools-file: %s: pool %q has block_size %d, this router -block-size %d: set them equal", c.PoolsFile, c.Pool, bs, c.Router.BlockSize)
	}
	if len(specs) > 0 {
		if len(c.Router.WorkerChain) > 0 {
			return fmt.Errorf("-worker-chain and -pools-file (%s: pool %q: worker_chain) both set the worker chain: keep one", c.PoolsFile, c.Pool)
		}
		c.Router.WorkerChain = specs
	}
	return nil
}

func defaultRouterID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "router"
	}
	h = strings.NewReplacer("/", "-", " ", "-", ".", "-").Replace(h)
	return fmt.Sprintf("%s-%d-%x", h, os.Getpid(), time.Now().UnixNano()&0xffffff)
}
