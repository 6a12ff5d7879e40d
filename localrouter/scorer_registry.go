package localrouter

import (
	"fmt"
	"sort"
	"sync"
)

// ScorerRegistry is a set of worker-chain filters and scorers by name: the
// names a Config's worker chain may use (Config.Scorers; nil: the
// built-ins). Safe for concurrent use.
//
// A minimal version of the explicit registry (issue 22, item 3): the
// built-ins are still filled in by scorer_builtin.go; BuiltinScorers copies
// them into a fresh registry a program can add its own to.
type ScorerRegistry struct {
	mu      sync.RWMutex
	entries map[string]chainFactory
}

// NewScorerRegistry returns an empty registry.
func NewScorerRegistry() *ScorerRegistry {
	return &ScorerRegistry{entries: map[string]chainFactory{}}
}

// BuiltinScorers returns a fresh registry holding the built-in filters and
// scorers.
func BuiltinScorers() *ScorerRegistry {
	r := NewScorerRegistry()
	chainMu.RLock()
	defer chainMu.RUnlock()
	for name, f := range chainRegs {
		r.entries[name] = f
	}
	return r
}

// RegisterFilter adds a filter under name; a name already registered (as
// a filter or a scorer) is an error.
func (r *ScorerRegistry) RegisterFilter(name string, f FilterFactory) error {
	return r.register(name, chainFactory{filter: f}, f == nil)
}

// RegisterScorer adds a scorer under name; a name already registered (as
// a filter or a scorer) is an error.
func (r *ScorerRegistry) RegisterScorer(name string, f ScorerFactory) error {
	return r.register(name, chainFactory{scorer: f}, f == nil)
}

func (r *ScorerRegistry) register(name string, f chainFactory, isNil bool) error {
	if name == "" || isNil {
		return fmt.Errorf("localrouter: register worker chain entry %q: empty name or nil factory", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.entries[name]; ok {
		return fmt.Errorf("localrouter: worker chain entry %q registered twice", name)
	}
	r.entries[name] = f
	return nil
}

// lookup finds name in r (nil: the built-ins); when it is missing, it
// lists the names r knows, for the error.
func (r *ScorerRegistry) lookup(name string) (f chainFactory, ok bool, filters, scorers []string) {
	if r == nil {
		chainMu.RLock()
		defer chainMu.RUnlock()
		if f, ok = chainRegs[name]; !ok {
			filters, scorers = chainEntriesLocked()
		}
		return f, ok, filters, scorers
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if f, ok = r.entries[name]; ok {
		return f, true, nil, nil
	}
	for n, e := range r.entries {
		if e.filter != nil {
			filters = append(filters, n)
		} else {
			scorers = append(scorers, n)
		}
	}
	sort.Strings(filters)
	sort.Strings(scorers)
	return f, false, filters, scorers
}
