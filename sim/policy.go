package sim

import (
	"errors"
	"fmt"
	"math"
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
	// KindTTFT scores each worker by the request's predicted time to
	// first token there plus the GPU time of its own cache misses
	// (sim/ttft.go), the principle kvgate's default cost follows.
	KindTTFT = "ttft"
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
	// Chain is the local routers' worker chain (KindCost only; empty:
	// localrouter.CostWorkerChain, Dynamo's cost with Credit, Scale and
	// Temperature).
	// ParsePolicy makes one of "chain:<inline chain>".
	Chain []localrouter.ScorerSpec
	// Externality (KindTTFT only) weighs the GPU time of the request's own
	// uncached prefill against its predicted TTFT: 1 counts it once more,
	// as the delay it imposes on the request queued behind it.
	Externality float64
	// ExtAuto (KindTTFT only, "ext=auto") replaces Externality, on each
	// worker, by the requests expected to arrive there before this one's
	// first token (the pool's measured arrival rate per worker × the
	// predicted TTFT): each of them waits through this request's uncached
	// prefill.
	ExtAuto bool
	// Calibration (KindTTFT only) is how the ttft scorer learns the
	// engines' speed: CalibrationOnline (the default, "") fits each
	// worker's timing model from what its router observes, starting from
	// the shipped curves; CalibrationStatic keeps the shipped curves;
	// CalibrationOracle pins each worker's true model (the simulated
	// engine's own timing): the bound; CalibrationHistograms fits online
	// from the engines' scraped time to first token histograms alone, the
	// lifecycle's first tokens not taken as samples
	// (localrouter.Router.SetLifecycleSamples). The scorer is never given
	// the engines' speed otherwise (sim/ttft.go).
	Calibration string
}

// Calibration modes of a KindTTFT policy (Policy.Calibration).
const (
	CalibrationOnline = ""
	CalibrationStatic = "static"
	CalibrationOracle = "oracle"
	// CalibrationHistograms needs the engines scraped
	// (Engines.ScrapePeriod, on by default).
	CalibrationHistograms = "histograms"
)

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

// KVGate returns kvgate's default policy, the local router's default
// chain: the predicted-TTFT scorer (KindTTFT, localrouter/scorer_ttft.go)
// with the externality fixed at one request (ext=1).
//
// The principle: place a request where it adds the least waiting to the
// pool — its own time to first token on that worker, plus the delay its
// own prefill work imposes on the requests that will queue behind it there
// (Naor's social cost of joining a queue). Both are read off the engine's
// timing model (mocker.DefaultTiming), not fitted to a trace: the first
// token comes after every prefill token queued on the worker and the
// request's uncached ones, computed in chunks of max_num_batched_tokens,
// each iteration also paying a decode step priced at the worker's KV
// occupancy; the delay imposed is the GPU time of its uncached tokens
// (tokens found cached cost nobody anything), once for each request
// expected to arrive at that worker before this one's first token. At the
// rates the targets are set at that is about one (arrival rate per worker
// × predicted TTFT ≈ 1), and a fixed one keeps costs comparable across
// pools: KVGateAuto measures it per pool instead, and two pools then rank
// each other by two noisy local rates (13 % worse than flat on Mooncake).
// docs/replay-results.md ("Round 2, principled default") has the
// derivation and the measurements.
//
// Lower cache tiers are not in the scorer: compare KVGateCost and
// "kvgate-no-tiers" for CPU-tier runs.
func KVGate() Policy {
	p := TTFT(1)
	p.Name = "kvgate"
	return p
}

// KVGateStatic is KVGate without online calibration: every worker is
// priced with the shipped curves (mocker.DefaultTiming), whatever its
// engine runs.
func KVGateStatic() Policy {
	p := KVGate()
	p.Name, p.Calibration = "kvgate-static", CalibrationStatic
	return p
}

// KVGateOracle is KVGate told each worker's true timing model (pinned on
// its router, localrouter.Router.PinTiming): what calibration can reach at
// best.
func KVGateOracle() Policy {
	p := KVGate()
	p.Name, p.Calibration = "kvgate-oracle", CalibrationOracle
	return p
}

// KVGateHist is KVGate calibrating from the engines' time to first token
// histograms alone (scraped with the other engine signals), as for a pool
// whose first tokens the lifecycle never reports.
func KVGateHist() Policy {
	p := KVGate()
	p.Name, p.Calibration = "kvgate-hist", CalibrationHistograms
	return p
}

// KVGateAuto is KVGate with the externality measured: the pool's arrival
// rate per worker × the predicted TTFT (ext=auto; the rate estimator's
// time constant is 10 s).
func KVGateAuto() Policy {
	p := TTFT(0)
	p.Name, p.ExtAuto = "kvgate-auto", true
	return p
}

// KVGateCost returns the same principle in Dynamo's cost formula, what
// localrouter.Config can express, with the externality fixed at one
// request: overlap_score_credit 2 (a cached block saves its prefill time
// twice: this request's and the next one's), prefill_load_scale 766
// (one block's prefill time, 0.330 ms, over the extra decode-step time one
// active block costs an iteration, 28.27 ms / 65,536 blocks of a 1 M-token
// cache: active decode blocks barely delay a first token), temperature 0.
// It differs from KVGate where max(0, …) in Dynamo's formula clamps: on a
// worker whose cached prefix is longer than its queued and uncached work
// together, the queue is hidden.
func KVGateCost() Policy {
	return Policy{Name: "kvgate-cost", Kind: KindCost, Credit: 2, Scale: 766}
}

// KVGateRound1 returns round 1's kvgate cost, credit 8 / scale 8, chosen by
// a sweep on the Mooncake trace (kept for comparison).
func KVGateRound1() Policy {
	return Policy{Name: "kvgate-r1", Kind: KindCost, Credit: 8, Scale: 8}
}

// DefaultPolicies are the policies compared when none are named.
func DefaultPolicies() []Policy {
	return []Policy{
		{Name: KindRandom, Kind: KindRandom},
		{Name: KindRoundRobin, Kind: KindRoundRobin},
		{Name: KindLeastLoaded, Kind: KindLeastLoaded},
		{Name: KindKVOverlap, Kind: KindKVOverlap},
		Dynamo(),
		KVGateCost(),
		KVGate(),
	}
}

// ParsePolicy parses a policy name: random, round-robin, least-loaded,
// kv-overlap, dynamo, kvgate (calibrating online), kvgate-static (no
// calibration), kvgate-oracle (the engines' true timing pinned), kvgate-cost, kvgate-no-tiers (kvgate-cost
// blind to offloaded blocks), kvgate-r1 (round 1's credit 8 / scale 8),
// ttft[:ext=W] (the predicted-TTFT scorer; ext defaults to 1), or
// cost:credit=C,scale=S,temp=T,tiers=0|1 (any subset, the rest Dynamo's
// defaults; tiers=0 ignores lower cache tiers), or chain:<worker chain>
// (KindChainPrefix).
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
		p := KVGateCost()
		p.Name, p.NoTiers = s, true
		return p, nil
	case KindRandom, KindRoundRobin, KindLeastLoaded, KindKVOverlap, KindLLMD:
		return Policy{Name: s, Kind: s}, nil
	case "dynamo":
		return Dynamo(), nil
	case "kvgate":
		return KVGate(), nil
	case "kvgate-static":
		return KVGateStatic(), nil
	case "kvgate-oracle":
		return KVGateOracle(), nil
	case "kvgate-hist":
		return KVGateHist(), nil
	case "kvgate-auto":
		return KVGateAuto(), nil
	case "kvgate-cost":
		return KVGateCost(), nil
	case "kvgate-r1":
		return KVGateRound1(), nil
	}
	kind, args, _ := strings.Cut(s, ":")
	if kind == KindTTFT {
		return parseTTFT(s, args)
	}
	if kind != KindCost {
		return Policy{}, fmt.Errorf("%w: unknown policy %q (want random, round-robin, least-loaded, kv-overlap, dynamo, kvgate, kvgate-static, kvgate-oracle, kvgate-hist, kvgate-auto, kvgate-cost, kvgate-no-tiers, kvgate-r1, ttft:ext=… or cost:credit=…,scale=…,temp=…)", ErrConfig, s)
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

// TTFT returns the predicted-TTFT policy with externality weight ext.
func TTFT(ext float64) Policy {
	return Policy{Name: KindTTFT, Kind: KindTTFT, Externality: ext}
}

// parseTTFT parses "ttft", "ttft:ext=W" or "ttft:ext=auto", optionally
// with calib=online|static|oracle (Policy.Calibration).
func parseTTFT(s, args string) (Policy, error) {
	p := TTFT(1)
	p.Name = s
	if args == "" {
		return p, nil
	}
	for _, kv := range strings.Split(args, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if k == "ext" && v == "auto" {
			p.ExtAuto, p.Externality = true, 0
			continue
		}
		if k == "calib" {
			switch v {
			case "online":
				p.Calibration = CalibrationOnline
			case CalibrationStatic, CalibrationOracle, CalibrationHistograms:
				p.Calibration = v
			default:
				return Policy{}, fmt.Errorf("%w: policy %q: calib %q must be online, static, oracle or histograms", ErrConfig, s, v)
			}
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return Policy{}, fmt.Errorf("%w: policy %q: %q is not key=number", ErrConfig, s, kv)
		}
		if k != "ext" {
			return Policy{}, fmt.Errorf("%w: policy %q: unknown parameter %q (want ext or calib)", ErrConfig, s, k)
		}
		p.Externality, p.ExtAuto = f, false
	}
	return p, p.validate()
}

func (p Policy) validate() error {
	switch p.Kind {
	case KindRandom, KindRoundRobin, KindLeastLoaded, KindKVOverlap, KindLLMD:
		return nil
	case KindTTFT:
		if !(p.Externality >= 0) || math.IsInf(p.Externality, 0) {
			return fmt.Errorf("%w: policy %q: ext must be a number ≥ 0", ErrConfig, p.Name)
		}
		if c := p.Calibration; c != CalibrationOnline && c != CalibrationStatic && c != CalibrationOracle && c != CalibrationHistograms {
			return fmt.Errorf("%w: policy %q: unknown calibration %q", ErrConfig, p.Name, c)
		}
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
	// Only the ttft policies calibrate (elsewhere calibration would move
	// just Selection.Cost, which ranks pools: the baselines stay as they
	// were); the oracle's models are pinned instead.
	c.Calibrate = p.Kind == KindTTFT && (p.Calibration == CalibrationOnline || p.Calibration == CalibrationHistograms)
	if p.Kind == KindCost {
		c.OverlapScoreCredit, c.PrefillLoadScale, c.RouterTemperature = p.Credit, p.Scale, p.Temperature
		c.WorkerChain = p.Chain
		if len(c.WorkerChain) == 0 { // Dynamo's cost, no longer the library default
			c.WorkerChain = localrouter.CostWorkerChain()
		}
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
		if n := len(specs); n > 0 && !strings.Contains(part, ":") && strings.Contains(part, "=") && (strings.HasPrefix(specs[n-1], KindCost+":") || strings.HasPrefix(specs[n-1], KindTTFT+":")) {
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
