package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

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
	// MetricsAddr is the HTTP listen address of /metrics ("" disables).
	MetricsAddr string
	// Etcd endpoints (required).
	Etcd []string
	// NATS URL (required when the router uses KV events or replica sync).
	NATS string
	// RegisterTTL is the lease TTL of the router's etcd registration.
	RegisterTTL time.Duration
	// MetricsPeriod is how often each worker's engine metrics endpoint is
	// scraped (localrouter/signals; 0 disables, the default).
	MetricsPeriod time.Duration
	// Router is the router's own configuration.
	Router localrouter.Config
}

// DefaultConfig returns the defaults of every flag.
func DefaultConfig() Config {
	return Config{
		GRPCAddr:    ":7100",
		MetricsAddr: ":9100",
		RegisterTTL: 10 * time.Second,
		Router:      localrouter.DefaultConfig(),
	}
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
		return errors.New("--nats (KVGATE_NATS) is required unless --router-use-kv-events=false and --router-replica-sync=false")
	case c.RouterID == "" || strings.ContainsAny(c.RouterID, "/ "):
		return fmt.Errorf("--router-id %q: must be non-empty without '/' or ' '", c.RouterID)
	case c.RegisterTTL < time.Second:
		return fmt.Errorf("--register-ttl %v: must be at least 1s", c.RegisterTTL)
	}
	return c.Router.Validate()
}

// setting is one configuration value: its flag names, its environment
// variables (lowest precedence first: Dynamo's aliases, then kvgate's), and
// how to set it from text.
type setting struct {
	flags  []string
	envs   []string
	usage  string
	isBool bool
	set    func(string) error
	get    func() string
}

func (s *setting) String() string {
	if s == nil || s.get == nil {
		return ""
	}
	return s.get()
}
func (s *setting) Set(v string) error { return s.set(v) }
func (s *setting) IsBoolFlag() bool   { return s.isBool }

func settings(c *Config) []*setting {
	r := &c.Router
	return []*setting{
		{flags: []string{"pool"}, envs: []string{"KVGATE_POOL"}, usage: "pool this router serves (required)", set: str(&c.Pool), get: func() string { return c.Pool }},
		{flags: []string{"router-id"}, envs: []string{"KVGATE_ROUTER_ID"}, usage: "this replica's id (default: hostname-random)", set: str(&c.RouterID), get: func() string { return c.RouterID }},
		{flags: []string{"grpc-addr"}, envs: []string{"KVGATE_GRPC_ADDR"}, usage: "gRPC listen address", set: str(&c.GRPCAddr), get: func() string { return c.GRPCAddr }},
		{flags: []string{"advertise-addr"}, envs: []string{"KVGATE_ADVERTISE_ADDR"}, usage: "gRPC address registered in etcd (default: the listen address)", set: str(&c.AdvertiseAddr), get: func() string { return c.AdvertiseAddr }},
		{flags: []string{"metrics-addr"}, envs: []string{"KVGATE_METRICS_ADDR"}, usage: "HTTP listen address of /metrics (empty: none)", set: str(&c.MetricsAddr), get: func() string { return c.MetricsAddr }},
		{flags: []string{"etcd"}, envs: []string{"KVGATE_ETCD"}, usage: "etcd endpoints, comma-separated (required)", set: list(&c.Etcd), get: func() string { return strings.Join(c.Etcd, ",") }},
		{flags: []string{"nats"}, envs: []string{"KVGATE_NATS"}, usage: "NATS URL (required with KV events or replica sync)", set: str(&c.NATS), get: func() string { return c.NATS }},
		{flags: []string{"register-ttl"}, envs: []string{"KVGATE_REGISTER_TTL"}, usage: "lease TTL of the router's etcd registration", set: dur(&c.RegisterTTL), get: func() string { return c.RegisterTTL.String() }},

		{flags: []string{"block-size", "router-block-size"}, envs: []string{"DYN_KV_CACHE_BLOCK_SIZE", "KVGATE_ROUTER_BLOCK_SIZE"}, usage: "KV block size in tokens", set: integer(&r.BlockSize, 1), get: func() string { return strconv.Itoa(r.BlockSize) }},
		{flags: []string{"router-overlap-score-credit"}, envs: []string{"DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "KVGATE_ROUTER_OVERLAP_SCORE_CREDIT"}, usage: "weight of cached blocks against prefill work", set: float(&r.OverlapScoreCredit), get: func() string { return fmtFloat(r.OverlapScoreCredit) }},
		{flags: []string{"router-prefill-load-scale"}, envs: []string{"DYN_ROUTER_PREFILL_LOAD_SCALE", "KVGATE_ROUTER_PREFILL_LOAD_SCALE"}, usage: "weight of prefill work against decode load", set: float(&r.PrefillLoadScale), get: func() string { return fmtFloat(r.PrefillLoadScale) }},
		{flags: []string{"router-temperature"}, envs: []string{"DYN_ROUTER_TEMPERATURE", "KVGATE_ROUTER_TEMPERATURE"}, usage: "0 picks the cheapest worker; > 0 samples a softmax over costs", set: float(&r.RouterTemperature), get: func() string { return fmtFloat(r.RouterTemperature) }},
		{flags: []string{"router-use-kv-events"}, envs: []string{"KVGATE_ROUTER_USE_KV_EVENTS"}, usage: "index from engine KV events (false: approximate index from the router's decisions)", isBool: true, set: boolean(&r.UseKVEvents), get: func() string { return strconv.FormatBool(r.UseKVEvents) }},
		{flags: []string{"router-track-active-blocks"}, envs: []string{"KVGATE_ROUTER_TRACK_ACTIVE_BLOCKS"}, usage: "count active decode blocks in the cost", isBool: true, set: boolean(&r.TrackActiveBlocks), get: func() string { return strconv.FormatBool(r.TrackActiveBlocks) }},
		{flags: []string{"router-replica-sync"}, envs: []string{"KVGATE_ROUTER_REPLICA_SYNC"}, usage: "share request lifecycle with the pool's other router replicas", isBool: true, set: boolean(&r.ReplicaSync), get: func() string { return strconv.FormatBool(r.ReplicaSync) }},
		{flags: []string{"router-ttl"}, envs: []string{"KVGATE_ROUTER_TTL"}, usage: "TTL of approximate-index entries (duration, or seconds)", set: dur(&r.TTL), get: func() string { return r.TTL.String() }},
		{flags: []string{"router-max-tree-size"}, envs: []string{"KVGATE_ROUTER_MAX_TREE_SIZE"}, usage: "bound on approximate-index entries", set: integer(&r.MaxTreeSize, 1), get: func() string { return strconv.Itoa(r.MaxTreeSize) }},
		{flags: []string{"min-initial-workers", "router-min-initial-workers"}, envs: []string{"DYN_ROUTER_MIN_INITIAL_WORKERS", "KVGATE_ROUTER_MIN_INITIAL_WORKERS"}, usage: "not ready (health NOT_SERVING, UNAVAILABLE) until this many workers joined", set: integer(&r.MinInitialWorkers, 0), get: func() string { return strconv.Itoa(r.MinInitialWorkers) }},
		{flags: []string{"router-metrics-period"}, envs: []string{"KVGATE_ROUTER_METRICS_PERIOD"}, usage: "scrape each worker's engine metrics (vLLM/SGLang /metrics) this often (duration, or seconds; 0 disables)", set: durOrZero(&c.MetricsPeriod), get: func() string { return c.MetricsPeriod.String() }},
		{flags: []string{"router-waiting-weight"}, envs: []string{"KVGATE_ROUTER_WAITING_WEIGHT"}, usage: "cost in blocks per request waiting in the engine's queue (engine metrics; 0: unused)", set: float(&r.WaitingWeight), get: func() string { return fmtFloat(r.WaitingWeight) }},
		{flags: []string{"router-kv-usage-weight"}, envs: []string{"KVGATE_ROUTER_KV_USAGE_WEIGHT"}, usage: "cost in blocks of a full engine KV cache, proportionally below (engine metrics; 0: unused)", set: float(&r.KVUsageWeight), get: func() string { return fmtFloat(r.KVUsageWeight) }},
		{flags: []string{"router-saturation-kv-usage"}, envs: []string{"KVGATE_ROUTER_SATURATION_KV_USAGE"}, usage: "skip a rank whose engine reports KV usage at least this (0..1) with requests waiting (0 disables)", set: float(&r.SaturationKVUsage), get: func() string { return fmtFloat(r.SaturationKVUsage) }},
		{flags: []string{"router-saturation-waiting"}, envs: []string{"KVGATE_ROUTER_SATURATION_WAITING"}, usage: "skip a rank whose engine reports this many waiting requests or more (0 disables)", set: integer(&r.SaturationWaiting, 0), get: func() string { return strconv.Itoa(r.SaturationWaiting) }},
		{flags: []string{"router-tier-weights"}, envs: []string{"KVGATE_ROUTER_TIER_WEIGHTS"}, usage: "credit of a cached block per lower cache tier, relative to the GPU (tier=weight,…; none: ignore offloaded blocks)", set: func(v string) error {
			w, err := localrouter.ParseTierWeights(v)
			if err == nil {
				r.TierWeights = w
			}
			return err
		}, get: func() string { return localrouter.FormatTierWeights(r.TierWeights) }},
		{flags: []string{"router-request-expiry"}, envs: []string{"KVGATE_ROUTER_REQUEST_EXPIRY"}, usage: "free requests still active after this long (duration, or seconds)", set: dur(&r.RequestExpiry), get: func() string { return r.RequestExpiry.String() }},
	}
}

// ParseFlags builds a Config from the defaults, then the environment (read
// with getenv; Dynamo's names are aliases that kvgate's override), then the
// command-line flags. Every error names the flag or variable at fault.
// -h returns flag.ErrHelp after printing the usage to usage.
func ParseFlags(name string, args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	c := DefaultConfig()
	ss := settings(&c)
	for _, s := range ss {
		for _, env := range s.envs {
			if v := getenv(env); v != "" {
				if err := s.set(v); err != nil {
					return Config{}, fmt.Errorf("environment variable %s=%q: %w", env, v, err)
				}
			}
		}
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, s := range ss {
		for i, f := range s.flags {
			u := s.usage
			if i > 0 {
				u = "alias of --" + s.flags[0]
			} else if len(s.envs) > 0 {
				u += " [env " + strings.Join(s.envs, ", ") + "]"
			}
			fs.Var(s, f, u)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(usage)
			fmt.Fprintf(usage, "usage: kvgate %s [flags]\n\nflags (the environment variable in brackets sets the default):\n", name)
			fs.PrintDefaults()
			return Config{}, err
		}
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if c.RouterID == "" {
		c.RouterID = defaultRouterID()
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func defaultRouterID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "router"
	}
	h = strings.NewReplacer("/", "-", " ", "-", ".", "-").Replace(h)
	return fmt.Sprintf("%s-%d-%x", h, os.Getpid(), time.Now().UnixNano()&0xffffff)
}

func str(p *string) func(string) error {
	return func(v string) error { *p = strings.TrimSpace(v); return nil }
}

func list(p *[]string) func(string) error {
	return func(v string) error {
		*p = (*p)[:0]
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				*p = append(*p, e)
			}
		}
		return nil
	}
}

func integer(p *int, minimum int) func(string) error {
	return func(v string) error {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		if n < minimum {
			return fmt.Errorf("must be ≥ %d", minimum)
		}
		*p = n
		return nil
	}
}

func float(p *float64) func(string) error {
	return func(v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("not a finite number")
		}
		if f < 0 {
			return fmt.Errorf("must be ≥ 0")
		}
		*p = f
		return nil
	}
}

func boolean(p *bool) func(string) error {
	return func(v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("not a boolean (true or false)")
		}
		*p = b
		return nil
	}
}

// durOrZero is dur that also accepts 0 (disabled).
func durOrZero(p *time.Duration) func(string) error {
	return func(v string) error {
		t := strings.TrimSpace(v)
		if d, err := time.ParseDuration(t); err == nil && d == 0 {
			*p = 0
			return nil
		}
		if f, err := strconv.ParseFloat(t, 64); err == nil && f == 0 {
			*p = 0
			return nil
		}
		return dur(p)(v)
	}
}

// dur accepts a Go duration ("90s", "2m") or a number of seconds ("120").
func dur(p *time.Duration) func(string) error {
	return func(v string) error {
		v = strings.TrimSpace(v)
		d, err := time.ParseDuration(v)
		if err != nil {
			f, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return fmt.Errorf("not a duration (like 120s) or a number of seconds")
			}
			d = time.Duration(f * float64(time.Second))
		}
		if d <= 0 {
			return fmt.Errorf("must be positive")
		}
		*p = d
		return nil
	}
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
