package policies

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/kvgate/kvgate/lib/config"
)

// Built-in policy names.
const (
	NameModelMatch   = "model-match"
	NameHeaderMatch  = "header-match"
	NameKVOverlap    = "kv-overlap"
	NameCost         = "cost"
	NameFailover     = "failover"
	NameDisaggregate = "disaggregate"
)

var (
	_ Policy = (*ModelMatch)(nil)
	_ Policy = (*HeaderMatch)(nil)
	_ Policy = (*KVOverlap)(nil)
	_ Policy = (*Cost)(nil)
	_ Policy = (*Failover)(nil)
	_ Policy = (*Disaggregate)(nil)
)

// noArgs refuses arguments where a policy takes none.
func noArgs(s Section, what string) error {
	var none struct{}
	return s.Decode(what, &none)
}

// ModelMatch keeps the pools that serve the request's model ("*" in a
// pool's models serves any). Filter; no arguments.
type ModelMatch struct{}

func newModelMatch(a Args) (Policy, error) {
	if err := noArgs(a.Chain, fmt.Sprintf("policy %q", a.Policy)); err != nil {
		return nil, err
	}
	if _, err := DecodePools(a, struct{}{}); err != nil {
		return nil, err
	}
	return ModelMatch{}, nil
}

// Name implements Policy.
func (ModelMatch) Name() string { return NameModelMatch }

// Rank implements Policy.
func (ModelMatch) Rank(req *Request, cands []Candidate) ([]Candidate, error) {
	return slices.DeleteFunc(cands, func(c Candidate) bool {
		return !slices.Contains(c.Models, req.Model) && !slices.Contains(c.Models, "*")
	}), nil
}

// HeaderMatch keeps the pools whose required headers the request carries.
// Per pool: `header-match: {headers: {x-tenant: [acme, beta]}}` — every
// listed header must be present with one of its values (an empty list:
// present with any value). Pools without a section accept every request.
// Filter.
type HeaderMatch struct {
	rules map[string]map[string][]string
}

// HeaderMatchPool is a pool's header-match section.
type HeaderMatchPool struct {
	Headers map[string][]string `yaml:"headers"`
}

func newHeaderMatch(a Args) (Policy, error) {
	if err := noArgs(a.Chain, fmt.Sprintf("policy %q", a.Policy)); err != nil {
		return nil, err
	}
	pools, err := DecodePools(a, HeaderMatchPool{})
	if err != nil {
		return nil, err
	}
	h := &HeaderMatch{rules: make(map[string]map[string][]string, len(pools))}
	for pool, p := range pools {
		if len(p.Headers) == 0 {
			return nil, config.Errorf(a.Pools[pool].File, a.Pools[pool].Node, fmt.Sprintf("pool %q: policy %q", pool, a.Policy), "headers: at least one header required")
		}
		lower := make(map[string][]string, len(p.Headers))
		for k, v := range p.Headers {
			lower[lowerASCII(k)] = v
		}
		h.rules[pool] = lower
	}
	return h, nil
}

// Name implements Policy.
func (*HeaderMatch) Name() string { return NameHeaderMatch }

// Rank implements Policy.
func (h *HeaderMatch) Rank(req *Request, cands []Candidate) ([]Candidate, error) {
	return slices.DeleteFunc(cands, func(c Candidate) bool {
		for name, values := range h.rules[c.Pool] {
			got, ok := req.Header(name)
			if !ok || (len(values) > 0 && !slices.Contains(values, got)) {
				return true
			}
		}
		return false
	}), nil
}

func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// KVOverlap ranks pools by the prompt tokens their best worker already
// caches, most first (tokens, not blocks, so pools of different block sizes
// compare). Scorer; no arguments.
type KVOverlap struct{}

func newKVOverlap(a Args) (Policy, error) {
	if err := noArgs(a.Chain, fmt.Sprintf("policy %q", a.Policy)); err != nil {
		return nil, err
	}
	if _, err := DecodePools(a, struct{}{}); err != nil {
		return nil, err
	}
	return KVOverlap{}, nil
}

// Name implements Policy.
func (KVOverlap) Name() string { return NameKVOverlap }

// Rank implements Policy.
func (KVOverlap) Rank(_ *Request, cands []Candidate) ([]Candidate, error) {
	slices.SortStableFunc(cands, func(a, b Candidate) int {
		return cmp.Compare(b.Probe.CachedTokens(), a.Probe.CachedTokens())
	})
	return cands, nil
}

// Cost ranks pools by their best worker's local-router cost, lowest first.
// A local router's cost (routing.Selection.Cost) is in one unit whatever
// its pool's worker chain: the predicted waiting in milliseconds that the
// request adds on that worker (its TTFT plus the delay it imposes, from
// the engine timing model the pool's ttft scorer is calibrated to). It is
// divided by the pool's `scale` (per pool, default 1), for pools whose
// local routers run the default calibration on faster workers: a pool of
// twice-as-fast workers declares 2 (better: calibrate its ttft scorer).
// Scorer.
type Cost struct {
	scale map[string]float64
}

// CostPool is a pool's cost section.
type CostPool struct {
	Scale float64 `yaml:"scale"`
}

func newCost(a Args) (Policy, error) {
	if err := noArgs(a.Chain, fmt.Sprintf("policy %q", a.Policy)); err != nil {
		return nil, err
	}
	pools, err := DecodePools(a, CostPool{Scale: 1})
	if err != nil {
		return nil, err
	}
	c := &Cost{scale: make(map[string]float64, len(pools))}
	for pool, p := range pools {
		if !(p.Scale > 0) || math.IsInf(p.Scale, 0) {
			return nil, config.Errorf(a.Pools[pool].File, a.Pools[pool].Node, fmt.Sprintf("pool %q: policy %q", pool, a.Policy), "scale: got %v, want a positive number", p.Scale)
		}
		c.scale[pool] = p.Scale
	}
	return c, nil
}

// Name implements Policy.
func (*Cost) Name() string { return NameCost }

// Normalised returns the candidate's cost (milliseconds) divided by its
// pool's scale.
func (c *Cost) Normalised(cd Candidate) float64 {
	s, ok := c.scale[cd.Pool]
	if !ok {
		s = 1
	}
	return cd.Probe.Cost / s
}

// Rank implements Policy.
func (c *Cost) Rank(_ *Request, cands []Candidate) ([]Candidate, error) {
	slices.SortStableFunc(cands, func(a, b Candidate) int {
		return cmp.Compare(c.Normalised(a), c.Normalised(b))
	})
	return cands, nil
}

// Failover ranks pools by tier, lowest first: tier 0 serves while any of its
// pools is reachable; the next tiers are fallbacks. Per pool: `failover:
// {tier: 1}` (default 0). Put it late in the chain so that it is the
// strongest key; earlier scorers order pools within a tier. Scorer.
type Failover struct {
	tier map[string]int
}

// FailoverPool is a pool's failover section.
type FailoverPool struct {
	Tier int `yaml:"tier"`
}

func newFailover(a Args) (Policy, error) {
	if err := noArgs(a.Chain, fmt.Sprintf("policy %q", a.Policy)); err != nil {
		return nil, err
	}
	pools, err := DecodePools(a, FailoverPool{})
	if err != nil {
		return nil, err
	}
	f := &Failover{tier: make(map[string]int, len(pools))}
	for pool, p := range pools {
		if p.Tier < 0 {
			return nil, config.Errorf(a.Pools[pool].File, a.Pools[pool].Node, fmt.Sprintf("pool %q: policy %q", pool, a.Policy), "tier: got %d, want ≥ 0", p.Tier)
		}
		f.tier[pool] = p.Tier
	}
	return f, nil
}

// Name implements Policy.
func (*Failover) Name() string { return NameFailover }

// Rank implements Policy.
func (f *Failover) Rank(_ *Request, cands []Candidate) ([]Candidate, error) {
	slices.SortStableFunc(cands, func(a, b Candidate) int {
		return cmp.Compare(f.tier[a.Pool], f.tier[b.Pool])
	})
	return cands, nil
}
