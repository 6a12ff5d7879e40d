package localrouter

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/api/routing"
)

// A worker chain is how BestWorker ranks a pool's worker ranks: filters
// that leave candidates out, then weighted scorers whose sum is each
// candidate's total; the lowest total wins (ties at random, or a softmax
// sample at router_temperature > 0, as the cost alone always did).
//
// The chain is built once per configuration (New), never per request,
// from specs naming filters and scorers of the Config's ScorerRegistry
// (Config.Scorers; nil: BuiltinScorers), as pool policies are built from
// their registry (policies.Registry).
//
// Normalisation: every scorer but cost gives each candidate a raw value in
// [0, 1] (prefix: [-1, 0], a reward), lower being better, so that weights
// compare directly: weight 2 on prefix and 1 on decode says a fully cached
// prompt is worth twice the gap between the least and the most loaded
// candidate. Load scorers divide by the largest value among the
// candidates (all 0 when all are 0); fractions (prefix overlap, KV usage)
// are used as they are. cost is Dynamo's cost in blocks, unnormalised, so
// that the default chain is Dynamo's choice exactly; its normalize=max arg
// divides it by the candidates' largest cost to mix it with the others.
//
// A filter that would leave no candidate is not applied (the chain goes on
// with all of them), as the saturation filter always did. Filters are
// never applied to a forced worker (BestWorkerOptions.Worker).
//
// The default chain (an empty Config.WorkerChain) is saturation then ttft
// (DefaultWorkerChain); Dynamo's choice, costs and tie-breaks exactly are
// CostWorkerChain (saturation then cost at weight 1, "-worker-chain
// cost").
//
// Selection.Cost is in one unit whatever the chain, so that the global
// router compares pools: the ttft scorer's prediction for the chosen
// worker in milliseconds (its TTFT plus the delay it imposes), by the
// chain's ttft scorer when it has one, else by one at the default
// calibration. Selection.ChainScore is the winner's total in the chain's
// own units.

// ScorerSpec is one entry of a worker chain: a filter or a scorer by name,
// the scorer's weight, and its arguments (api/routing, shared with the
// pools file's worker_chain on the client side).
type ScorerSpec = routing.ScorerSpec

// DefaultWorkerChain is the chain of a Config whose WorkerChain is empty:
// the saturation filter, then the ttft scorer at the mocker's timing
// (scorer_ttft.go: predicted TTFT plus the delay imposed on the requests
// arriving behind; docs/localrouter.md "The ttft scorer").
func DefaultWorkerChain() []ScorerSpec {
	return []ScorerSpec{{Name: saturationName}, {Name: ttftName, Weight: 1}}
}

// CostWorkerChain is Dynamo's chain, the default before the ttft scorer:
// the saturation filter, then Dynamo's cost (Config.OverlapScoreCredit,
// PrefillLoadScale, the engine-signal weights). -worker-chain cost
// selects it (the filter leaves none out unless saturation is set).
func CostWorkerChain() []ScorerSpec {
	return []ScorerSpec{{Name: saturationName}, {Name: "cost", Weight: 1}}
}

// FormatWorkerChain writes specs as ParseWorkerChain reads them.
func FormatWorkerChain(specs []ScorerSpec) string {
	parts := make([]string, len(specs))
	for i, s := range specs {
		parts[i] = s.String()
	}
	return strings.Join(parts, ",")
}

// ParseWorkerChain parses the inline form of a chain: entries separated by
// commas, each name[=weight][/arg=value]...; e.g.
// "saturation,cost=1/normalize=max,prefix=2,cold=1/lru_size=512". Errors
// name the entry. The specs are not validated against the registry
// (ValidateWorkerChain does).
func ParseWorkerChain(s string) ([]ScorerSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []ScorerSpec
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return nil, fmt.Errorf("%w: worker chain entry %d: empty", ErrInvalidConfig, i+1)
		}
		parts := strings.Split(entry, "/")
		name, w, hasW := strings.Cut(parts[0], "=")
		spec := ScorerSpec{Name: strings.TrimSpace(name)}
		if spec.Name == "" {
			return nil, fmt.Errorf("%w: worker chain entry %d %q: no name", ErrInvalidConfig, i+1, entry)
		}
		if hasW {
			f, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
			if err != nil {
				return nil, fmt.Errorf("%w: worker chain entry %q: weight %q is not a number", ErrInvalidConfig, entry, w)
			}
			spec.Weight = f
		}
		for _, kv := range parts[1:] {
			k, v, ok := strings.Cut(kv, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" {
				return nil, fmt.Errorf("%w: worker chain entry %q: argument %q is not key=value", ErrInvalidConfig, entry, kv)
			}
			if spec.Args == nil {
				spec.Args = map[string]string{}
			}
			if _, dup := spec.Args[k]; dup {
				return nil, fmt.Errorf("%w: worker chain entry %q: argument %q given twice", ErrInvalidConfig, entry, k)
			}
			spec.Args[k] = strings.TrimSpace(v)
		}
		out = append(out, spec)
	}
	return out, nil
}

// ChainInput is what filters and scorers see of one decision. Every slice
// is indexed by candidate (the pool's ranks BestWorker considers, after
// the allowed and stale sets); filters and scorers must not modify it nor
// keep it past the call.
type ChainInput struct {
	// Loads are the candidates' potential loads with the request; Engine
	// and HasEngine are set where the rank's metrics are scraped.
	Loads []PotentialLoad
	// Overlap is each candidate's cached prefix in GPU-block equivalents
	// (blocks on lower tiers at their Config.TierWeights).
	Overlap []float64
	// Costs are Dynamo's costs (the engine-signal term included).
	Costs []float64
	// ISL is the prompt length in tokens, RequestBlocks its complete blocks.
	ISL, RequestBlocks, BlockSize int
	// LoRA is the request's adapter ("" for the base model); SessionKey
	// its session ("" for none).
	LoRA, SessionKey string
	// Cold: no candidate holds any block of the request.
	Cold bool
	// Now is the decision's time on the router's Clock.
	Now time.Time
	// PoolRanks is the number of the pool's worker ranks (every member,
	// whatever the candidates of this decision).
	PoolRanks int
}

// Filter leaves candidates out. Skip returns why candidate j is left out,
// "" to keep it; it is called on the request's goroutine, concurrently
// for different requests, and must not block.
type Filter interface {
	Skip(in *ChainInput, j int) string
}

// Scorer gives candidates raw values, lower being better, normalised as
// the package documentation says. Score writes out[k] for candidate
// cand[k]; it is called concurrently for different requests and must not
// block nor allocate on the per-request path where it can avoid it.
type Scorer interface {
	Score(in *ChainInput, cand []int, out []float64)
}

// Observer is implemented by scorers with state: Chosen is called when a
// request is placed on candidate j (a request id or UpdateIndexer), not
// for probes.
type Observer interface {
	Chosen(in *ChainInput, j int)
}

// ChainArgs are a filter's or scorer's arguments, read by its factory.
// An argument the factory does not read is an error naming it.
type ChainArgs struct {
	// Entry is the name the entry is built under.
	Entry string
	// Config is the pool's router configuration.
	Config Config
	args   map[string]string
	used   map[string]bool
}

// Float returns argument key as a number (def when absent).
func (a *ChainArgs) Float(key string, def float64) (float64, error) {
	a.used[key] = true
	v, ok := a.args[key]
	if !ok {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w: worker chain %q: argument %s=%q is not a number", ErrInvalidConfig, a.Entry, key, v)
	}
	return f, nil
}

// String returns argument key (def when absent), which must be one of
// allowed when allowed is not empty.
func (a *ChainArgs) String(key, def string, allowed ...string) (string, error) {
	a.used[key] = true
	v, ok := a.args[key]
	if !ok {
		return def, nil
	}
	if len(allowed) > 0 && !slices.Contains(allowed, v) {
		return "", fmt.Errorf("%w: worker chain %q: argument %s=%q: want one of %s", ErrInvalidConfig, a.Entry, key, v, strings.Join(allowed, ", "))
	}
	return v, nil
}

// Has reports whether argument key is given.
func (a *ChainArgs) Has(key string) bool {
	_, ok := a.args[key]
	return ok
}

func (a *ChainArgs) unknown() error {
	for _, k := range slices.Sorted(maps.Keys(a.args)) {
		if !a.used[k] {
			known := slices.Sorted(maps.Keys(a.used))
			if len(known) == 0 {
				return fmt.Errorf("%w: worker chain %q: unknown argument %q (it takes none)", ErrInvalidConfig, a.Entry, k)
			}
			return fmt.Errorf("%w: worker chain %q: unknown argument %q (known: %s)", ErrInvalidConfig, a.Entry, k, strings.Join(known, ", "))
		}
	}
	return nil
}

// FilterFactory and ScorerFactory build a chain entry from its arguments.
type (
	FilterFactory func(*ChainArgs) (Filter, error)
	ScorerFactory func(*ChainArgs) (Scorer, error)
)

// ValidateWorkerChain builds specs against cfg and returns the first
// error: an unknown filter or scorer, an unknown or bad argument, a bad
// weight. Errors name the entry.
func ValidateWorkerChain(specs []ScorerSpec, cfg Config) error {
	_, err := buildChain(specs, cfg)
	return err
}

type chainScorer struct {
	name   string
	weight float64
	s      Scorer
}

type chainFilter struct {
	name string
	f    Filter
}

// workerChain is a built chain: immutable, but its scorers may keep state
// (Observer).
type workerChain struct {
	filters   []chainFilter
	scorers   []chainScorer
	observers []Observer
	// report: the answer lists each scorer's contribution (every chain but
	// the default and Dynamo's, whose one term is Selection.ChainScore).
	report bool
	// credit and scale, when set (the cost scorer's arguments), replace
	// the Config's overlap_score_credit and prefill_load_scale.
	credit, scale *float64
	// cost: the chain has the cost scorer (it reads the cost parameters).
	cost bool
	// session: the chain reads the request's session key (the session
	// scorer, or an entry not built in; scorer_knobs.go).
	session bool
	// timing is the ttft scorer whose prediction is Selection.Cost: the
	// chain's own (its first), else one at the default calibration.
	timing *ttftScorer
}

// selectionCost is Selection.Cost for candidate j of in: the predicted
// waiting in milliseconds (ttftScorer.millis), whatever the chain.
func (c *workerChain) selectionCost(in *ChainInput, j int) float64 {
	return c.timing.millis(in, j, c.timing.perWorker(in))
}

// selectionTTFT is Selection.TTFT for candidate j of in: the predicted
// time to first token alone, in milliseconds (by the same timing).
func (c *workerChain) selectionTTFT(in *ChainInput, j int) float64 {
	return c.timing.ttftMillis(in, j)
}

func buildChain(specs []ScorerSpec, cfg Config) (*workerChain, error) {
	if len(specs) == 0 {
		specs = DefaultWorkerChain()
	}
	// The default chain and Dynamo's (one scorer, whose value is
	// Selection.ChainScore) report no scores: their decision path
	// allocates nothing.
	f := FormatWorkerChain(specs)
	plain := f == FormatWorkerChain(DefaultWorkerChain()) || f == FormatWorkerChain(CostWorkerChain()) || f == "cost" || f == "cost=1"
	c := &workerChain{report: !plain}
	seen := map[string]bool{}
	for i, sp := range specs {
		if seen[sp.Name] {
			return nil, fmt.Errorf("%w: worker chain: %q named twice", ErrInvalidConfig, sp.Name)
		}
		seen[sp.Name] = true
		if err := c.add(i, sp, cfg); err != nil {
			return nil, err
		}
	}
	if len(c.scorers) == 0 {
		return nil, fmt.Errorf("%w: worker chain has no scorer (filters only)", ErrInvalidConfig)
	}
	if c.timing == nil {
		t, err := newTTFTScorer(&ChainArgs{Entry: ttftName, Config: cfg, used: map[string]bool{}})
		if err != nil {
			return nil, err
		}
		c.timing = t.(*ttftScorer)
	}
	return c, nil
}

// ValidateScorerSpec builds the one entry sp (the i-th of its chain,
// from 0) against cfg and returns its error.
func ValidateScorerSpec(i int, sp ScorerSpec, cfg Config) error {
	return (&workerChain{}).add(i, sp, cfg)
}

// add builds entry i and appends it to c.
func (c *workerChain) add(i int, sp ScorerSpec, cfg Config) error {
	reg := cfg.registry()
	f, ok := reg.lookup(sp.Name)
	if !ok {
		filters, scorers := reg.Entries()
		return fmt.Errorf("%w: worker chain entry %d: unknown filter or scorer %q (filters: %s; scorers: %s)", ErrInvalidConfig, i+1, sp.Name, strings.Join(filters, ", "), strings.Join(scorers, ", "))
	}
	a := &ChainArgs{Entry: sp.Name, Config: cfg, args: sp.Args, used: map[string]bool{}}
	if f.filter != nil {
		if sp.Weight != 0 {
			return fmt.Errorf("%w: worker chain %q: a filter takes no weight", ErrInvalidConfig, sp.Name)
		}
		flt, err := f.filter(a)
		if err != nil {
			return err
		}
		if err := a.unknown(); err != nil {
			return err
		}
		c.filters = append(c.filters, chainFilter{sp.Name, flt})
		c.session = c.session || !builtinEntry(sp.Name)
		return nil
	}
	w := sp.Weight
	if w == 0 {
		w = 1
	}
	if !(w > 0) || math.IsInf(w, 0) {
		return fmt.Errorf("%w: worker chain %q: weight %g must be > 0", ErrInvalidConfig, sp.Name, sp.Weight)
	}
	sc, err := f.scorer(a)
	if err != nil {
		return err
	}
	if err := a.unknown(); err != nil {
		return err
	}
	if cs, ok := sc.(*costScorer); ok {
		c.credit, c.scale, c.cost = cs.credit, cs.scale, true
	}
	if t, ok := sc.(*ttftScorer); ok && c.timing == nil {
		c.timing = t
	}
	c.scorers = append(c.scorers, chainScorer{sp.Name, w, sc})
	if _, ok := sc.(sessionScorer); ok || !builtinEntry(sp.Name) {
		c.session = true
	}
	if o, ok := sc.(Observer); ok {
		c.observers = append(c.observers, o)
	}
	return nil
}

// chainScratch is the chain's per-request scratch (in the Router's scratch).
type chainScratch struct {
	in     ChainInput
	cand   []int // candidates left after the filters
	next   []int
	raw    []float64 // raw values, scorer-major: raw[k*len(cand)+i]
	totals []float64
}

// run applies the filters (unless forced) and scorers to s.in's
// candidates. It returns the candidates left, their totals, and the ranks
// skipped with why (allocated only when some are); saturated counts the
// saturation filter's skips, allSaturated says it would have left none.
func (c *workerChain) run(s *chainScratch, forced bool) (skipped []Skip, saturated int, allSaturated bool) {
	n := len(s.in.Loads)
	s.cand = s.cand[:0]
	for j := 0; j < n; j++ {
		s.cand = append(s.cand, j)
	}
	if !forced {
		for _, f := range c.filters {
			s.next = s.next[:0]
			first := len(skipped)
			for _, j := range s.cand {
				if why := f.f.Skip(&s.in, j); why != "" {
					skipped = append(skipped, Skip{Worker: s.in.Loads[j].Worker, Reason: why})
					continue
				}
				s.next = append(s.next, j)
			}
			if len(s.next) == 0 { // it would leave none: not applied
				skipped = skipped[:first]
				if f.name == saturationName {
					allSaturated = true
				}
				continue
			}
			if f.name == saturationName {
				saturated += len(skipped) - first
			}
			s.cand, s.next = s.next, s.cand
		}
	}
	m := len(s.cand)
	s.raw = slices.Grow(s.raw[:0], m*len(c.scorers))[:m*len(c.scorers)]
	s.totals = slices.Grow(s.totals[:0], m)[:m]
	clear(s.totals)
	for k, sc := range c.scorers {
		out := s.raw[k*m : (k+1)*m]
		sc.s.Score(&s.in, s.cand, out)
		for i, v := range out {
			s.totals[i] += sc.weight * v
		}
	}
	return skipped, saturated, allSaturated
}

// scores is the winner's (candidate position i among s.cand) contribution
// of each scorer.
func (c *workerChain) scores(s *chainScratch, i int) []routing.Score {
	m := len(s.cand)
	out := make([]routing.Score, len(c.scorers))
	for k, sc := range c.scorers {
		raw := s.raw[k*m+i]
		out[k] = routing.Score{Name: sc.name, Raw: raw, Weight: sc.weight, Contribution: sc.weight * raw}
	}
	return out
}
