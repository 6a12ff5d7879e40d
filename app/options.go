package app

import (
	"fmt"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/policies"
)

// An Option adds to what Main's subcommands build with: a pool policy, a
// worker-chain scorer or filter. Options apply in order; a name already
// taken (a built-in's, or an earlier option's) is an error Main reports
// before running anything.
type Option func(*extensions) error

// WithPolicy adds a pool policy under name (policies.Registry.Register):
// the global router's configuration may name it in its chain (kvgate
// extproc, kvgate policy check).
func WithPolicy(name string, f policies.Factory) Option {
	return func(x *extensions) error { return x.policies.Register(name, f) }
}

// WithScorer adds a worker-chain scorer under name
// (localrouter.ScorerRegistry.RegisterScorer): a local router's worker
// chain may name it (kvgate localrouter -worker-chain, a pool's
// worker_chain in the configuration kvgate extproc and kvgate policy check
// read).
func WithScorer(name string, f localrouter.ScorerFactory) Option {
	return func(x *extensions) error { return x.scorers.RegisterScorer(name, f) }
}

// WithFilter adds a worker-chain filter under name
// (localrouter.ScorerRegistry.RegisterFilter), as WithScorer.
func WithFilter(name string, f localrouter.FilterFactory) Option {
	return func(x *extensions) error { return x.scorers.RegisterFilter(name, f) }
}

// extensions are the registries the subcommands build with: the built-ins
// plus the options'.
type extensions struct {
	policies *policies.Registry
	scorers  *localrouter.ScorerRegistry
}

func newExtensions(opts []Option) (*extensions, error) {
	x := &extensions{policies: policies.NewRegistry(), scorers: localrouter.BuiltinScorers()}
	if err := policies.RegisterBuiltins(x.policies); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if err := o(x); err != nil {
			return nil, fmt.Errorf("app option: %w", err)
		}
	}
	return x, nil
}

// policyRegistry is x's policies (nil x: nil, the built-ins).
func (x *extensions) policyRegistry() *policies.Registry {
	if x == nil {
		return nil
	}
	return x.policies
}

// scorerRegistry is x's scorers (nil x: nil, the built-ins).
func (x *extensions) scorerRegistry() *localrouter.ScorerRegistry {
	if x == nil {
		return nil
	}
	return x.scorers
}
