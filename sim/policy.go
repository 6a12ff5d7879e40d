package sim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
)

// Policy kinds.
const (
	KindRandom      = "random"
	KindRoundRobin  = "round-robin"
	KindLeastLoaded = "least-loaded"
	KindKVOverlap   = "kv-overlap"
	KindCost        = "cost"
)

// Policy is one routing policy under test.
type Policy struct {
	// Name labels the policy in reports.
	Name string
	// Kind is one of the Kind constants.
	Kind string
	// Credit, Scale and Temperature are the local router's cost parameters
	// (KindCost only): overlap_score_credit, prefill_load_scale,
	// router_temperature.
	Credit, Scale, Temperature float64
	// NoTiers makes the cost ignore blocks held on lower cache tiers
	// (tier_weights none); by default they count at
	// localrouter.DefaultTierWeights.
	NoTiers bool
	// Chain is the local routers' worker chain (KindCost only; empty: the
	// default chain, Dynamo's cost with Credit, Scale and Temperature).
	// ParsePolicy makes one of "chain:<inline chain>".
	Chain []localrouter.ScorerSpec
}

// KindChainPrefix starts a policy naming a worker chain:
// chain:<localrouter.ParseWorkerChain's inline form>, e.g.
// chain:cost=1/credit=8/scale=8,cold=2. It is a cost policy whose local
// routers rank workers with that chain (Dynamo's credit and scale unless
// the cost scorer's args say otherwise).
const KindChainPrefix = "chain:"

// Dynamo returns Dynamo's default cost: credit 1, scale 1, temperature 0.
func Dynamo() Policy {
	return Policy{Name: "dynamo", Kind: KindCost, Credit: 1, Scale: 1}
}

// KVGate returns kvgate's default cost policy: Dynamo's cost function with
// overlap_score_credit 8 and prefill_load_scale 8 (temperature 0).
//
// Why: Dynamo's cost adds the worker's active decode blocks, unscaled, to
// its prefill blocks. On long-context workloads (Mooncake: 15k-token prompts
// on average) an active request holds ~1,000 blocks, so the decode term
// dwarfs the prefill term and the router degenerates into "least KV
// footprint": it scatters conversations away from their caches exactly when
// load rises, and the lost hits cost more prefill, which raises load
// further. Scaling the prefill term by 8 makes queued and uncached prefill
// work (what TTFT is made of) dominate again; crediting each cached block 8
// times keeps a conversation on the worker holding its history unless that
// worker is far busier. On the synthetic Mooncake trace with 8 workers this
// keeps TTFT equal at 1x load and cuts mean TTFT by 43 % at 6x and 93 % at
// 8x against Dynamo's defaults (docs/replay-results.md has the sweep).
func KVGate() Policy {
	return Policy{Name: "kvgate", Kind: KindCost, Credit: 8, Scale: 8}
}

// DefaultPolicies are the policies compared when none are named.
func DefaultPolicies() []Policy {
	return []Policy{
		{Name: KindRandom, Kind: KindRandom},
		{Name: KindRoundRobin, Kind: KindRoundRobin},
		{Name: KindLeastLoaded, Kind: KindLeastLoaded},
		{Name: KindKVOverlap, Kind: KindKVOverlap},
		Dynamo(),
		KVGate(),
	}
}

// ParsePolicy parses a policy name: random, round-robin, least-loaded,
// kv-overlap, dynamo, kvgate, kvgate-no-tiers (kvgate's cost blind to
// offloaded blocks), cost:credit=C,scale=S,temp=T,tiers=0|1 (any subset,
// the rest Dynamo's defaults; tiers=0 ignores lower cache tiers), or
// chain:<worker chain> (KindChainPrefix).
func ParsePolicy(s string) (Policy, error) {
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, KindChainPrefix); ok {
		specs, err := localrouter.ParseWorkerChain(rest)
		if err == nil && len(specs) == 0 {
			err = errors.New("empty worker chain")
		}
		if err == nil {
			err = localrouter.ValidateWorkerChain(specs, localrouter.DefaultConfig())
		}
		if err != nil {
			return Policy{}, fmt.Errorf("%w: policy %q: %v", ErrConfig, s, err)
		}
		p := Dynamo()
		p.Name, p.Chain = s, specs
		return p, nil
	}
	switch s {
	case "kvgate-no-tiers":
		p := KVGate()
		p.Name, p.NoTiers = s, true
		return p, nil
	case KindRandom, KindRoundRobin, KindLeastLoaded, KindKVOverlap:
		return Policy{Name: s, Kind: s}, nil
	case "dynamo":
		return Dynamo(), nil
	case "kvgate":
		return KVGate(), nil
	}
	kind, args, _ := strings.Cut(s, ":")
	if kind != KindCost {
		return Policy{}, fmt.Errorf("%w: unknown policy %q (want random, round-robin, least-loaded, kv-overlap, dynamo, kvgate or cost:credit=…,scale=…,temp=…)", ErrConfig, s)
	}
	p := Dynamo()
	p.Name = s
	if args == "" {
		return p, nil
	}
	for _, kv := range strings.Split(args, ",") {
		k, v, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return Policy{}, fmt.Errorf("%w: policy %q: %q is not key=number", ErrConfig, s, kv)
		}
		switch k {
		case "credit":
			p.Credit = f
		case "scale":
			p.Scale = f
		case "temp":
			p.Temperature = f
		case "tiers":
			p.NoTiers = f == 0
		default:
			return Policy{}, fmt.Errorf("%w: policy %q: unknown parameter %q (want credit, scale, temp or tiers)", ErrConfig, s, k)
		}
	}
	return p, p.validate()
}

func (p Policy) validate() error {
	switch p.Kind {
	case KindRandom, KindRoundRobin, KindLeastLoaded, KindKVOverlap:
		return nil
	case KindCost:
		if p.Credit < 0 || p.Scale < 0 || p.Temperature < 0 {
			return fmt.Errorf("%w: policy %q: cost parameters must not be negative", ErrConfig, p.Name)
		}
		return nil
	}
	return fmt.Errorf("%w: policy %q: unknown kind %q", ErrConfig, p.Name, p.Kind)
}

// routerConfig is the local router configuration of every pool under p.
// predictedTTL < 0 records no predicted entries; 0 keeps the default.
func (p Policy) routerConfig(blockSize int, predictedTTL time.Duration) localrouter.Config {
	c := localrouter.DefaultConfig()
	c.BlockSize = blockSize
	switch {
	case predictedTTL < 0:
		c.PredictedTTL = 0
	case predictedTTL > 0:
		c.PredictedTTL = predictedTTL
	}
	if p.Kind == KindCost {
		c.OverlapScoreCredit, c.PrefillLoadScale, c.RouterTemperature = p.Credit, p.Scale, p.Temperature
		c.WorkerChain = p.Chain
	}
	if p.NoTiers {
		for t := range c.TierWeights {
			if t != int(kvevents.TierGPU) {
				c.TierWeights[t] = 0
			}
		}
	}
	return c
}

// ParsePolicies parses a comma-separated list of policies. A cost policy's
// own commas are understood: "dynamo,cost:credit=2,scale=1,kvgate" is three
// policies; so are a chain policy's, whose entries after the first carry a
// weight or name a filter: "dynamo,chain:saturation,cost=1,cold=1,kvgate".
func ParsePolicies(s string) ([]Policy, error) {
	var specs []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if n := len(specs); n > 0 && !strings.Contains(part, ":") && strings.Contains(part, "=") && strings.HasPrefix(specs[n-1], KindCost+":") {
			specs[n-1] += "," + part
			continue
		}
		if n := len(specs); n > 0 && !strings.Contains(part, ":") && strings.HasPrefix(specs[n-1], KindChainPrefix) && chainEntry(part) {
			specs[n-1] += "," + part
			continue
		}
		specs = append(specs, part)
	}
	var out []Policy
	for _, spec := range specs {
		p, err := ParsePolicy(spec)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseTopologies parses a comma-separated list of topologies.
func ParseTopologies(s string) ([]Topology, error) {
	var out []Topology
	for _, part := range strings.Split(s, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		t, err := ParseTopology(part)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// chainEntry reports whether part continues a chain policy: it carries a
// weight or arguments, or names a filter.
func chainEntry(part string) bool {
	if strings.ContainsAny(part, "=/") {
		return true
	}
	filters, _ := localrouter.ChainEntries()
	return slices.Contains(filters, part)
}
