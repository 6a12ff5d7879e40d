package policies

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/lib/config"
)

// NamePriority is the priority policy's name.
const NamePriority = "priority"

var _ Policy = (*Priority)(nil)

// Priority routes by the request's priority (x-kvgate-priority, an
// integer, default 0, higher more important). Chain arguments:
//
//	tiers:                        # the first tier whose range holds the priority wins
//	  - {min_priority: 10, pools: [reserved], exclusive: true}
//	  - {min_priority: 1, max_priority: 9, pools: [fast]}
//	shed:                         # 429 for priority ≤ max_priority when every pool is loaded
//	  max_priority: -1
//	  max_prefill_tokens: 65536
//	  max_decode_tokens: 1048576
//
// The matched tier's pools rank first; the others keep their order behind
// them (as Dynamo's priority overrides pick a pool, but with fallbacks).
// Within the tier the chain's order is kept. An exclusive tier reserves its
// pools: requests outside every tier listing such a pool do not get it.
//
// Shedding reads each candidate's probe: Probe.PrefillTokens (the best
// worker's potential prefill tokens — the prompt tokens still to prefill on
// it, this request's uncached ones included) and Probe.DecodeBlocks ×
// Probe.BlockSize (its potential active KV in tokens, this request's blocks
// included). A candidate is loaded when a configured figure is strictly
// above its threshold (0: that figure is not checked). When every decode
// and aggregated candidate left is loaded (prefill pools are not counted: a
// decode worker can prefill locally), a request of priority ≤
// shed.max_priority is refused with ErrSaturated (429, retry later).
// Scorer, and a filter for exclusive tiers.
type Priority struct {
	tiers    []PriorityTier
	reserved []string
	shed     *PriorityShed
}

// PriorityArgs are priority's chain arguments.
type PriorityArgs struct {
	Tiers []PriorityTier `yaml:"tiers"`
	Shed  *PriorityShed  `yaml:"shed"`
}

// PriorityTier maps a range of priorities (bounds inclusive; a bound left
// out is open) to the pools that rank first.
type PriorityTier struct {
	MinPriority *int     `yaml:"min_priority"`
	MaxPriority *int     `yaml:"max_priority"`
	Pools       []string `yaml:"pools"`
	// Exclusive reserves the pools for this tier's requests.
	Exclusive bool `yaml:"exclusive"`
}

func (t *PriorityTier) holds(p int) bool {
	return (t.MinPriority == nil || p >= *t.MinPriority) && (t.MaxPriority == nil || p <= *t.MaxPriority)
}

// PriorityShed says which requests are shed, and at what load.
type PriorityShed struct {
	// MaxPriority: requests of this priority or lower are shed (required).
	MaxPriority *int `yaml:"max_priority"`
	// MaxPrefillTokens bounds Probe.PrefillTokens (0: not checked).
	MaxPrefillTokens int `yaml:"max_prefill_tokens"`
	// MaxDecodeTokens bounds Probe.DecodeBlocks × Probe.BlockSize (0: not
	// checked).
	MaxDecodeTokens int `yaml:"max_decode_tokens"`
}

// Loaded reports whether c is above one of the shed thresholds.
func (s *PriorityShed) Loaded(c Candidate) bool {
	return (s.MaxPrefillTokens > 0 && c.Probe.PrefillTokens > s.MaxPrefillTokens) ||
		(s.MaxDecodeTokens > 0 && c.Probe.DecodeBlocks*max(c.Probe.BlockSize, 1) > s.MaxDecodeTokens)
}

func newPriority(a Args) (Policy, error) {
	what := fmt.Sprintf("policy %q", a.Policy)
	var args PriorityArgs
	if err := a.DecodeChain(&args); err != nil {
		return nil, err
	}
	if _, err := DecodePools(a, struct{}{}); err != nil {
		return nil, err
	}
	root := a.Chain.Node
	if len(args.Tiers) == 0 && args.Shed == nil {
		return nil, config.Errorf(a.Chain.File, root, what, "at least one of tiers, shed required")
	}
	p := &Priority{tiers: args.Tiers, shed: args.Shed}
	for i, t := range args.Tiers {
		if t.MinPriority != nil && t.MaxPriority != nil && *t.MinPriority > *t.MaxPriority {
			return nil, config.Errorf(a.Chain.File, config.NodeAt(root, "tiers", i, "max_priority"), what, "tiers[%d]: max_priority %d is below min_priority %d", i, *t.MaxPriority, *t.MinPriority)
		}
		if len(t.Pools) == 0 {
			return nil, config.Errorf(a.Chain.File, config.NodeAt(root, "tiers", i), what, "tiers[%d].pools: at least one pool required", i)
		}
		for j, pool := range t.Pools {
			n := config.NodeAt(root, "tiers", i, "pools", j)
			if pool == "" {
				return nil, config.Errorf(a.Chain.File, n, what, "tiers[%d].pools[%d]: empty pool name", i, j)
			}
			if slices.Contains(t.Pools[:j], pool) {
				return nil, config.Errorf(a.Chain.File, n, what, "tiers[%d].pools: pool %q listed twice", i, pool)
			}
			if err := a.CheckPool(n, fmt.Sprintf("%s: tiers[%d].pools[%d]", what, i, j), pool); err != nil {
				return nil, err
			}
			if t.Exclusive && !slices.Contains(p.reserved, pool) {
				p.reserved = append(p.reserved, pool)
			}
		}
	}
	if s := args.Shed; s != nil {
		n := config.NodeAt(root, "shed")
		switch {
		case s.MaxPriority == nil:
			return nil, config.Errorf(a.Chain.File, n, what, "shed.max_priority required (requests of this priority or lower are shed)")
		case s.MaxPrefillTokens < 0:
			return nil, config.Errorf(a.Chain.File, config.NodeAt(root, "shed", "max_prefill_tokens"), what, "shed.max_prefill_tokens: got %d, want ≥ 0", s.MaxPrefillTokens)
		case s.MaxDecodeTokens < 0:
			return nil, config.Errorf(a.Chain.File, config.NodeAt(root, "shed", "max_decode_tokens"), what, "shed.max_decode_tokens: got %d, want ≥ 0", s.MaxDecodeTokens)
		case s.MaxPrefillTokens == 0 && s.MaxDecodeTokens == 0:
			return nil, config.Errorf(a.Chain.File, n, what, "shed: at least one of max_prefill_tokens, max_decode_tokens required")
		}
	}
	return p, nil
}

// NewPriority returns a priority policy for chains built in Go; it
// validates args as the YAML configuration is.
func NewPriority(args PriorityArgs) (*Priority, error) {
	p, err := newPriority(Args{Policy: NamePriority, Chain: SectionOf(args)})
	if err != nil {
		return nil, err
	}
	return p.(*Priority), nil
}

// Name implements Policy.
func (*Priority) Name() string { return NamePriority }

// Tier returns the tier req's priority falls in, or nil.
func (p *Priority) Tier(req *Request) *PriorityTier {
	for i := range p.tiers {
		if p.tiers[i].holds(req.Priority) {
			return &p.tiers[i]
		}
	}
	return nil
}

// Rank implements Policy.
func (p *Priority) Rank(req *Request, cands []Candidate) ([]Candidate, error) {
	tier := p.Tier(req)
	var mine []string
	if tier != nil {
		mine = tier.Pools
	}
	if len(p.reserved) > 0 {
		cands = slices.DeleteFunc(cands, func(c Candidate) bool {
			return slices.Contains(p.reserved, c.Pool) && !slices.Contains(mine, c.Pool)
		})
	}
	if s := p.shed; s != nil && req.Priority <= *s.MaxPriority {
		serving, loaded := 0, 0
		for _, c := range cands {
			if c.Role == RolePrefill {
				continue
			}
			serving++
			if s.Loaded(c) {
				loaded++
			}
		}
		if serving > 0 && loaded == serving {
			return nil, fmt.Errorf("priority %d ≤ %d and all %d pools above the load threshold: %w", req.Priority, *s.MaxPriority, serving, ErrSaturated)
		}
	}
	if len(mine) > 0 {
		slices.SortStableFunc(cands, func(a, b Candidate) int {
			return cmp.Compare(b2i(!slices.Contains(mine, a.Pool)), b2i(!slices.Contains(mine, b.Pool)))
		})
	}
	return cands, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
