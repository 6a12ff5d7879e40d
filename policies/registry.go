package policies

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/lib/config"
)

// Args are what a Factory gets to build a policy: its arguments in the
// chain and in each pool's policy section.
type Args struct {
	// Policy is the name the policy is built under.
	Policy string
	// Chain holds the arguments of the policy's chain entry (may be empty).
	Chain Section
	// Pools holds the policy's section of each pool that has one, keyed by
	// pool name.
	Pools map[string]Section
	// PoolNames are every pool of the configuration, sorted, when the
	// caller of Build said (KnownPools); nil when unknown. Policies whose
	// arguments name pools check the names against it (CheckPool).
	PoolNames []string
}

// CheckPool returns an error at node n when the configuration's pools are
// known and name is not one of them.
func (a Args) CheckPool(n *yaml.Node, what, name string) error {
	if a.PoolNames == nil {
		return nil
	}
	if _, ok := slices.BinarySearch(a.PoolNames, name); !ok {
		return config.Errorf(a.Chain.File, n, what, "no pool %q (pools: %s)", name, strings.Join(a.PoolNames, ", "))
	}
	return nil
}

// BuildOption adjusts Build.
type BuildOption func(*buildOptions)

type buildOptions struct {
	pools []string
}

// KnownPools tells Build the names of every pool of the configuration, so
// that policies whose arguments name pools (slo-grid, priority) refuse a
// name that is no pool. Without it those names are not checked: a pool
// that does not exist never answers a probe, so it never ranks.
func KnownPools(names ...string) BuildOption {
	return func(o *buildOptions) {
		o.pools = append(make([]string, 0, len(names)), names...)
		slices.Sort(o.pools)
	}
}

// DecodeChain strictly decodes the chain arguments into out (left as is
// when there are none).
func (a Args) DecodeChain(out any) error {
	return a.Chain.Decode(fmt.Sprintf("policy %q", a.Policy), out)
}

// DecodePools strictly decodes each pool's section with decode, which gets
// a fresh value to fill; the results are keyed by pool name.
func DecodePools[T any](a Args, defaults T) (map[string]T, error) {
	out := make(map[string]T, len(a.Pools))
	for _, pool := range sortedKeys(a.Pools) {
		v := defaults
		if err := a.Pools[pool].Decode(fmt.Sprintf("pool %q: policy %q", pool, a.Policy), &v); err != nil {
			return nil, err
		}
		out[pool] = v
	}
	return out, nil
}

// Factory builds a policy from its arguments. It validates them: an error
// should be a PosError (see Errorf) naming the file, line and field.
type Factory func(Args) (Policy, error)

// Registry maps policy names to factories. It is safe for concurrent use.
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: make(map[string]Factory)}
}

// Register adds a factory under name; a name already registered is an
// error wrapping ErrDuplicate.
func (r *Registry) Register(name string, f Factory) error {
	if name == "" || f == nil {
		return fmt.Errorf("policies: register %q: empty name or nil factory", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.factories[name]; ok {
		return fmt.Errorf("policies: register %q: %w", name, ErrDuplicate)
	}
	r.factories[name] = f
	return nil
}

// Names lists the registered policies, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return sortedKeys(r.factories)
}

// Build makes the chain specs name, giving each policy its chain arguments
// and the sections the pools hold for it. A spec naming an unregistered
// policy, a policy named twice in the chain, and a pool section for a
// policy the chain does not run are errors naming file and line. With
// KnownPools, pool names in policy arguments are checked too.
func (r *Registry) Build(specs []Spec, pools map[string]PoolSection, opts ...BuildOption) (*Chain, error) {
	var o buildOptions
	for _, opt := range opts {
		opt(&o)
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	inChain := make(map[string]bool, len(specs))
	ps := make([]Policy, 0, len(specs))
	for _, s := range specs {
		f, ok := r.factories[s.Name]
		if !ok {
			return nil, &config.PosError{File: s.Args.File, Line: s.Line, Column: s.Column, What: "chain",
				Msg: fmt.Sprintf("%v %q (registered: %s)", ErrUnknownPolicy, s.Name, strings.Join(sortedKeys(r.factories), ", "))}
		}
		if inChain[s.Name] {
			return nil, &config.PosError{File: s.Args.File, Line: s.Line, Column: s.Column, What: "chain",
				Msg: fmt.Sprintf("policy %q appears twice", s.Name)}
		}
		inChain[s.Name] = true
		args := Args{Policy: s.Name, Chain: s.Args, Pools: map[string]Section{}, PoolNames: o.pools}
		for pool, sec := range pools {
			if v, ok := sec[s.Name]; ok {
				args.Pools[pool] = v
			}
		}
		p, err := f(args)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	for _, pool := range sortedKeys(pools) {
		for _, name := range sortedKeys(pools[pool]) {
			if !inChain[name] {
				sec := pools[pool][name]
				what := fmt.Sprintf("pool %q", pool)
				if _, known := r.factories[name]; !known {
					return nil, config.Errorf(sec.File, keyNode(sec), what, "%v %q", ErrUnknownPolicy, name)
				}
				return nil, config.Errorf(sec.File, keyNode(sec), what, "policy %q is configured but not in the chain", name)
			}
		}
	}
	return NewChain(ps...), nil
}

func keyNode(s Section) *yaml.Node { return s.Node }

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// RegisterBuiltins registers the built-in policies in r.
func RegisterBuiltins(r *Registry) error {
	for _, b := range []struct {
		name string
		f    Factory
	}{
		{NameModelMatch, newModelMatch},
		{NameHeaderMatch, newHeaderMatch},
		{NameKVOverlap, newKVOverlap},
		{NameCost, newCost},
		{NameFailover, newFailover},
		{NameDisaggregate, newDisaggregate},
		{NameWeighted, newWeighted},
		{NameSessionAffinity, newSessionAffinity},
		{NameSLOGrid, newSLOGrid},
		{NamePriority, newPriority},
	} {
		if err := r.Register(b.name, b.f); err != nil {
			return err
		}
	}
	return nil
}
