package sim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/localrouter"
)

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("invalid replay config")

// Topology kinds.
const (
	// TopologyFlat is one pool of all workers behind one local router.
	TopologyFlat = "flat"
	// TopologyPools is Pools pools of Workers/Pools workers, each behind its
	// own local router, with a global selection step across them.
	TopologyPools = "pools"
	// TopologyDisagg is a prefill pool of PrefillWorkers workers and a
	// decode pool of the rest: a request is prefilled in the first, its KV
	// transferred, and decoded in the second.
	TopologyDisagg = "disagg"
)

// Topology is one arrangement of the workers.
type Topology struct {
	Kind string
	// Pools is the number of pools of TopologyPools (2).
	Pools int
	// PrefillWorkers is the prefill pool's size in TopologyDisagg
	// (Workers/2).
	PrefillWorkers int
	// Config names the configuration of TopologyConfig (Config.Global).
	Config string
	// Regions and RegionPools shape TopologyTree: Regions region routers
	// of RegionPools leaf pools each.
	Regions, RegionPools int
}

// Name is the topology as the report labels it, e.g. "pools=2".
func (t Topology) Name() string {
	switch t.Kind {
	case TopologyConfig:
		return TopologyConfig + ":" + t.Config
	case TopologyPools:
		return fmt.Sprintf("pools=%d", t.Pools)
	case TopologyDisagg:
		return fmt.Sprintf("disagg=%d", t.PrefillWorkers)
	case TopologyTree:
		return fmt.Sprintf("tree=%dx%d", t.Regions, t.RegionPools)
	}
	return t.Kind
}

// ParseTopology parses "flat", "pools", "pools=P", "disagg", "disagg=K"
// (K prefill workers) or "tree=RxP" (R regions of P pools; TopologyTree).
// Zero counts take their defaults in Config.
func ParseTopology(s string) (Topology, error) {
	kind, arg, hasArg := strings.Cut(strings.TrimSpace(s), "=")
	t := Topology{Kind: kind}
	if kind == TopologyTree {
		if !hasArg {
			return t, fmt.Errorf("%w: topology %q: tree needs its shape, tree=REGIONSxPOOLS (e.g. tree=2x2)", ErrConfig, s)
		}
		return parseTree(s, arg)
	}
	n := 0
	if hasArg {
		var err error
		if n, err = strconv.Atoi(arg); err != nil || n <= 0 {
			return t, fmt.Errorf("%w: topology %q: %q is not a positive count", ErrConfig, s, arg)
		}
	}
	switch kind {
	case TopologyFlat:
		if hasArg {
			return t, fmt.Errorf("%w: topology %q: flat takes no count", ErrConfig, s)
		}
	case TopologyPools:
		t.Pools = n
	case TopologyDisagg:
		t.PrefillWorkers = n
	default:
		return t, fmt.Errorf("%w: unknown topology %q (want flat, pools[=P], disagg[=prefill workers] or tree=RxP)", ErrConfig, s)
	}
	return t, nil
}

// Config is one replay: a trace, the workers, and the topologies and
// policies to compare. Each (topology, policy) pair is simulated from the
// same trace and seed.
type Config struct {
	// Trace is the workload (LoadTrace). Required.
	Trace *Trace
	// TraceName labels the report (e.g. the file name).
	TraceName string
	// Rate scales arrivals (2 = twice as fast; default 1).
	Rate float64
	// MaxRequests replays only the first requests (0: all).
	MaxRequests int
	// Seed drives token expansion and every random choice.
	Seed uint64
	// Workers is the total number of simulated workers (8).
	Workers int
	// Topologies to simulate (default: flat).
	Topologies []Topology
	// Policies to compare (default: DefaultPolicies).
	Policies []Policy
	// BlockSize is the KV block size of workers and routers (16).
	BlockSize int
	// KVTokens is each worker's KV cache capacity in tokens (1,048,576: the
	// Dynamo mocker's default 16384 blocks of 64).
	KVTokens int
	// CPUKVTokens is each worker's CPU (host memory) KV tier in tokens (0:
	// none): blocks evicted from the GPU cache are offloaded there and
	// reloaded on a hit (mocker.Config.CPUBlocks), with their KV events.
	CPUKVTokens int
	// MaxNumSeqs and MaxNumBatchedTokens bound each worker's batches (the
	// mocker's defaults: 256 and 8192).
	MaxNumSeqs, MaxNumBatchedTokens int
	// Speedup divides the timing model's durations (1).
	Speedup float64
	// EventDelay delays KV events between a worker and its router (0).
	EventDelay time.Duration
	// PredictedTTL is the routers' predicted-entry TTL (0: the router's
	// default, 10 s; negative: no predicted entries, the index is the KV
	// events' alone).
	PredictedTTL time.Duration
	// Global, when set, replays a global router configuration (the real
	// Decide, global.go) instead of Topologies × Policies: one simulation,
	// topology "config:<Global.Name>".
	Global *GlobalReplay
	// FlowControl runs the global router's flow-control queue in
	// virtual time (with Global only; sim/flow.go): saturated requests
	// wait instead of being shed. The configuration's flow_control
	// section sets it up (its defaults when the section is off).
	FlowControl bool
	// TreeCommit, when set, is the probe.commit mode of TopologyTree's
	// global routers (default: globalrouter's, decide-and-commit).
	TreeCommit globalrouter.CommitMode
	// Load, when positive, sets the arrival rate to Load × the pools'
	// capacity, measured first (Calibrate; Rate is then ignored). Config
	// replays only.
	Load float64
	// SLOMS is the TTFT target in ms of each priority the requests carry
	// (nil: the defaults of mix.go, from the unloaded TTFT).
	SLOMS map[int]float64
	// Parallel is how many simulations run at once (1).
	Parallel int
	// Progress, when set, receives a progress bar.
	Progress io.Writer
}

// routerConfig is the routers' configuration under a policy with Dynamo's
// cost, for the report's header.
func (c Config) routerConfig() localrouter.Config {
	return Policy{}.routerConfig(c.BlockSize, c.PredictedTTL)
}

func (c Config) withDefaults() Config {
	if c.Rate == 0 {
		c.Rate = 1
	}
	if c.Workers == 0 {
		c.Workers = 8
	}
	if c.Global != nil {
		c.Topologies = []Topology{{Kind: TopologyConfig, Config: c.Global.Name}}
		c.Policies = []Policy{{Name: c.Global.label(), Kind: KindCost, Credit: 1, Scale: 1}}
	}
	if len(c.Topologies) == 0 {
		c.Topologies = []Topology{{Kind: TopologyFlat}}
	}
	c.Topologies = append([]Topology(nil), c.Topologies...)
	for i := range c.Topologies {
		t := &c.Topologies[i]
		if t.Kind == TopologyPools && t.Pools == 0 {
			t.Pools = 2
		}
		if t.Kind == TopologyDisagg && t.PrefillWorkers == 0 {
			t.PrefillWorkers = c.Workers / 2
		}
	}
	if len(c.Policies) == 0 {
		c.Policies = DefaultPolicies()
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.KVTokens == 0 {
		c.KVTokens = 1 << 20
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = 256
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = 8192
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.Parallel <= 0 {
		c.Parallel = 1
	}
	return c
}

// Validate reports the first problem of c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Trace == nil:
		return fmt.Errorf("%w: no trace", ErrConfig)
	case c.Rate < 0:
		return fmt.Errorf("%w: rate %v must be positive", ErrConfig, c.Rate)
	case c.MaxRequests < 0:
		return fmt.Errorf("%w: request cap %d is negative", ErrConfig, c.MaxRequests)
	case c.Workers < 1:
		return fmt.Errorf("%w: workers %d must be positive", ErrConfig, c.Workers)
	case c.BlockSize < 1:
		return fmt.Errorf("%w: block size %d must be positive", ErrConfig, c.BlockSize)
	case c.CPUKVTokens < 0:
		return fmt.Errorf("%w: cpu kv capacity %d tokens must not be negative", ErrConfig, c.CPUKVTokens)
	case c.KVTokens < c.BlockSize:
		return fmt.Errorf("%w: kv capacity %d tokens is below one block", ErrConfig, c.KVTokens)
	case c.EventDelay < 0:
		return fmt.Errorf("%w: event delay %v is negative", ErrConfig, c.EventDelay)
	case c.Speedup < 0:
		return fmt.Errorf("%w: speedup %v is negative", ErrConfig, c.Speedup)
	case c.Load < 0 || math.IsInf(c.Load, 0) || math.IsNaN(c.Load):
		return fmt.Errorf("%w: load %v must be a positive multiple of the capacity", ErrConfig, c.Load)
	case c.Load > 0 && c.Global == nil:
		return fmt.Errorf("%w: load needs a configuration replay (its pools' capacity is what it multiplies)", ErrConfig)
	}
	if c.Global != nil {
		if err := c.Global.validate(c.Workers); err != nil {
			return err
		}
	} else if c.FlowControl {
		return fmt.Errorf("%w: flow control needs a global router configuration (--config)", ErrConfig)
	}
	for _, t := range c.Topologies {
		switch t.Kind {
		case TopologyConfig:
		case TopologyFlat:
		case TopologyTree:
			if err := validateTree(c, t); err != nil {
				return err
			}
		case TopologyPools:
			if t.Pools < 1 || c.Workers%t.Pools != 0 {
				return fmt.Errorf("%w: %d workers do not split into %d equal pools", ErrConfig, c.Workers, t.Pools)
			}
		case TopologyDisagg:
			if t.PrefillWorkers < 1 || t.PrefillWorkers >= c.Workers {
				return fmt.Errorf("%w: disaggregated topology needs 1..%d prefill workers, got %d", ErrConfig, c.Workers-1, t.PrefillWorkers)
			}
		default:
			return fmt.Errorf("%w: unknown topology %q", ErrConfig, t.Kind)
		}
	}
	for _, p := range c.Policies {
		if err := p.validate(); err != nil {
			return err
		}
	}
	return nil
}
