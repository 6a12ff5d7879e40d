package up

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/policies"
)

// PoolSpec is one pool of mock workers.
type PoolSpec struct {
	Name    string
	Workers int
	// DPSizes gives the data-parallel ranks of each worker, in order
	// (missing or 0: 1). A DP worker is one mocker serving that many
	// ranks, each with its own KV cache, as a vLLM or SGLang engine with
	// --data-parallel-size does.
	DPSizes []int
	// WorkerChain is the pool's worker chain (pool.Config.WorkerChain;
	// empty: the default), given to its local router.
	WorkerChain []localrouter.ScorerSpec
	// Region is the region router the pool is under (TopologyRegions).
	Region string
	// Role is the pool's role and its workers' (membership.RoleAggregated
	// when empty; TopologyDisaggregated's pools are prefill and decode).
	Role membership.Role
}

// dpSize is worker i's number of ranks.
func (p PoolSpec) dpSize(i int) int {
	if i < len(p.DPSizes) && p.DPSizes[i] > 0 {
		return p.DPSizes[i]
	}
	return 1
}

// Config shapes a local system. Zero fields take the defaults of
// DefaultConfig.
type Config struct {
	// Host is the interface everything listens on (127.0.0.1).
	Host string
	// GatewayAddr is the gateway's HTTP address (127.0.0.1:8080; port 0
	// picks one). ExtprocAddr is the ext_proc gRPC address
	// (127.0.0.1:9002, where the shipped Envoy bootstrap looks).
	GatewayAddr string
	ExtprocAddr string
	// AdminAddr serves the status page, status.json and metrics
	// (127.0.0.1:8081; port 0 picks one). Keep it on loopback: it lists
	// every internal address.
	AdminAddr string
	// MaxBodyBytes is the one request body limit of the system: the
	// ext_proc server's cap, the model's max_body_bytes (413 before
	// tokenizing) and every worker's limit (mocker.DefaultMaxBodyBytes).
	MaxBodyBytes int
	// Model is the model every worker serves ("mock-llama").
	Model string
	// BlockSize is the KV block size of every pool (16).
	BlockSize int
	Pools     []PoolSpec
	// Topology is TopologyFlat ("" too), TopologyRegions (the pools'
	// Region names their region router; RegionPools) or
	// TopologyDisaggregated (a prefill and a decode pool; DisaggregatedPools).
	Topology string
	// Speedup divides the mock workers' timing model (1: real-GPU-like).
	Speedup float64
	// UpstreamHTTP2: the gateway reaches the mock workers over h2c
	// (gateway.Config.UpstreamHTTP2); default HTTP/1.1.
	UpstreamHTTP2 bool
	// NumBlocks is each worker's KV cache size in blocks (8192).
	NumBlocks int
	// MaxNumSeqs bounds each worker's running sequences (0: the mocker's
	// default, 256): a small value makes the engines the bottleneck of a
	// load test on a small machine (kvgate bench -overload).
	MaxNumSeqs int
	// Chain replaces the global router's pool selection chain (nil: its
	// default), e.g. with a priority policy that sheds.
	Chain []policies.Spec
	// FlowControl is the global router's flow_control section (zero:
	// off): with Enabled, requests whose pools are all saturated wait in
	// its queue instead of being refused (docs/flow-control.md; `kvgate
	// bench -overload -overload-flow-control` sets it).
	FlowControl flowcontrol.Config
	// MetricsPeriod is how often the local routers scrape their workers'
	// engine metrics (500 ms; negative disables).
	MetricsPeriod time.Duration
	// ProbeTimeout bounds the global router's probes of the local routers
	// (0: globalrouter's default).
	ProbeTimeout time.Duration
	// Extproc configures the ext_proc server (its Addr is ExtprocAddr).
	Extproc extproc.Config
	// GatewayMaxHeaderBytes and GatewayBodyTimeout are the gateway's 431
	// and 408 bounds (envoy/gateway: 0 means its defaults, 60 KiB and 2
	// minutes).
	GatewayMaxHeaderBytes int
	GatewayBodyTimeout    time.Duration
	// SecureServing runs TLS on the ext_proc hop and mutual TLS on the
	// local-router hop, with a CA made at start (System.CAFile).
	SecureServing bool
	// Tenancy is the global router's tenancy section (off by default):
	// `kvgate up -tenant-header` turns salting on. TrustTokensSHA256 are
	// the global router's trust.tokens_sha256: the callers that may name
	// a tenant (tenancy.identity trusted, the default).
	Tenancy           globalrouter.TenancyConfig
	TrustTokensSHA256 []string
	// GlobalOptions are added to the global router's options, last
	// (benchmarks choose its local-router dialer with them).
	GlobalOptions []globalrouter.Option
	// Scorers are the worker-chain filters and scorers the pools' local
	// routers may name (nil: the built-ins; app.WithScorer adds to them).
	Scorers *localrouter.ScorerRegistry
	Logger  *slog.Logger
	// Observers watch the parts request by request (nil fields: none;
	// accounting.go).
	Observers Observers
	// TracerProvider traces the global router's decisions (nil: off).
	TracerProvider trace.TracerProvider
}

// DefaultConfig is `kvgate up`'s system: pool-a with 3 workers, pool-b
// with 2, the second of them serving two data-parallel ranks.
func DefaultConfig() Config {
	return Config{
		Host:          "127.0.0.1",
		GatewayAddr:   "127.0.0.1:8080",
		ExtprocAddr:   config.DefaultExtprocAddr,
		AdminAddr:     "127.0.0.1:8081",
		Model:         "mock-llama",
		BlockSize:     16,
		Pools:         []PoolSpec{{Name: "pool-a", Workers: 3}, {Name: "pool-b", Workers: 2, DPSizes: []int{1, 2}}},
		Speedup:       1,
		NumBlocks:     8192,
		MetricsPeriod: 500 * time.Millisecond,
	}
}

// OnLoopback makes the system listen on free loopback ports (gateway,
// ext_proc and admin at 127.0.0.1:0): a system a bench or a test starts in
// its own process, which asks it where it listens (System.GatewayURL,
// AdminURL) and collides with nothing else on the machine.
func (c *Config) OnLoopback() {
	c.GatewayAddr, c.ExtprocAddr, c.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
}

func (c *Config) defaults() {
	d := DefaultConfig()
	if c.Host == "" {
		c.Host = d.Host
	}
	if c.GatewayAddr == "" {
		c.GatewayAddr = d.GatewayAddr
	}
	if c.ExtprocAddr == "" {
		c.ExtprocAddr = d.ExtprocAddr
	}
	if c.AdminAddr == "" {
		c.AdminAddr = d.AdminAddr
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = mocker.DefaultMaxBodyBytes
	}
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.BlockSize == 0 {
		c.BlockSize = d.BlockSize
	}
	if len(c.Pools) == 0 {
		c.Pools = d.Pools
	}
	if c.Speedup == 0 {
		c.Speedup = d.Speedup
	}
	if c.NumBlocks == 0 {
		c.NumBlocks = d.NumBlocks
	}
	if c.MetricsPeriod == 0 {
		c.MetricsPeriod = d.MetricsPeriod
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
