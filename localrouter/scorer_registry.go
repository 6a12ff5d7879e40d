package localrouter

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// ScorerRegistry maps worker-chain entry names to the factories of filters
// and scorers, as policies.Registry does for pool policies. It is safe for
// concurrent use. A Config's Scorers names the registry its WorkerChain is
// built from (nil: BuiltinScorers); a program adds its own scorers to the
// built-ins:
//
//	reg := localrouter.BuiltinScorers()
//	if err := reg.RegisterScorer("my-scorer", newMyScorer); err != nil { ... }
//	cfg.Scorers = reg
//	cfg.WorkerChain = []localrouter.ScorerSpec{{Name: "saturation"}, {Name: "my-scorer", Weight: 1}}
type ScorerRegistry struct {
	mu sync.RWMutex
	m  map[string]chainFactory
}

// ErrDuplicateEntry is wrapped by RegisterScorer and RegisterFilter when
// the name is already registered (as a filter or a scorer).
var ErrDuplicateEntry = errors.New("worker chain entry already registered")

type chainFactory struct {
	filter FilterFactory
	scorer ScorerFactory
}

// NewScorerRegistry returns an empty registry.
func NewScorerRegistry() *ScorerRegistry {
	return &ScorerRegistry{m: map[string]chainFactory{}}
}

// BuiltinScorers returns a fresh registry holding the built-in filters and
// scorers (RegisterBuiltinScorers); adding to it changes no other.
func BuiltinScorers() *ScorerRegistry {
	r := NewScorerRegistry()
	if err := RegisterBuiltinScorers(r); err != nil {
		panic(err) // the built-in names are distinct
	}
	return r
}

// builtinScorers is the registry a Config without Scorers builds from;
// never exposed, so never added to.
var builtinScorers = sync.OnceValue(BuiltinScorers)

// registry is the registry c's WorkerChain is built from.
func (c Config) registry() *ScorerRegistry {
	if c.Scorers != nil {
		return c.Scorers
	}
	return builtinScorers()
}

// RegisterFilter adds a filter under name; a name already registered (as
// a filter or a scorer) is an error wrapping ErrDuplicateEntry.
func (r *ScorerRegistry) RegisterFilter(name string, f FilterFactory) error {
	return r.register(name, chainFactory{filter: f}, f == nil)
}

// RegisterScorer adds a scorer under name; a name already registered (as
// a filter or a scorer) is an error wrapping ErrDuplicateEntry.
func (r *ScorerRegistry) RegisterScorer(name string, f ScorerFactory) error {
	return r.register(name, chainFactory{scorer: f}, f == nil)
}

func (r *ScorerRegistry) register(name string, f chainFactory, isNil bool) error {
	if name == "" || isNil {
		return fmt.Errorf("localrouter: register worker chain entry %q: empty name or nil factory", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[name]; ok {
		return fmt.Errorf("localrouter: register %q: %w", name, ErrDuplicateEntry)
	}
	r.m[name] = f
	return nil
}

// Entries lists the registered filters and scorers, sorted.
func (r *ScorerRegistry) Entries() (filters, scorers []string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for name, f := range r.m {
		if f.filter != nil {
			filters = append(filters, name)
		} else {
			scorers = append(scorers, name)
		}
	}
	sort.Strings(filters)
	sort.Strings(scorers)
	return filters, scorers
}

func (r *ScorerRegistry) lookup(name string) (chainFactory, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	f, ok := r.m[name]
	return f, ok
}

// ChainEntries lists the built-in filters and scorers, sorted.
func ChainEntries() (filters, scorers []string) { return builtinScorers().Entries() }

// RegisterBuiltinScorers registers the built-in filters and scorers in r
// (scorer_builtin.go; docs/localrouter.md "Worker chain").
func RegisterBuiltinScorers(r *ScorerRegistry) error {
	for _, f := range []struct {
		name string
		f    FilterFactory
	}{
		{saturationName, newSaturationFilter},
		{"lora", func(*ChainArgs) (Filter, error) { return loraFilter{}, nil }},
	} {
		if err := r.RegisterFilter(f.name, f.f); err != nil {
			return err
		}
	}
	for _, s := range []struct {
		name string
		f    ScorerFactory
	}{
		{costName, newCostScorer},
		{"prefix", func(*ChainArgs) (Scorer, error) { return prefixScorer{}, nil }},
		{"prefill", func(*ChainArgs) (Scorer, error) { return loadScorer(prefillLoad), nil }},
		{"decode", func(*ChainArgs) (Scorer, error) { return loadScorer(decodeLoad), nil }},
		{waitingName, func(*ChainArgs) (Scorer, error) { return loadScorer(waitingLoad), nil }},
		{runningName, func(*ChainArgs) (Scorer, error) { return loadScorer(runningLoad), nil }},
		{kvUsageName, func(*ChainArgs) (Scorer, error) { return kvUsageScorer{}, nil }},
		{"lora-affinity", func(*ChainArgs) (Scorer, error) { return loraScorer{}, nil }},
		{"session", newSessionScorer},
		{"cold", newColdScorer},
		{ttftName, newTTFTScorer},
	} {
		if err := r.RegisterScorer(s.name, s.f); err != nil {
			return err
		}
	}
	return nil
}
