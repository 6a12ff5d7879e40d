package routing

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// ScorerSpec is one entry of a pool's worker chain: a filter or a scorer
// registered with a local router (localrouter.ScorerRegistry), its weight
// and its arguments. The pools file's per-pool worker_chain decodes to a
// list of them on the client side; only the local router, which owns the
// registry, knows which names and arguments exist.
//
// In YAML:
//
//   - name: cold
//     weight: 0.5
//     args: {lru_size: 512}
type ScorerSpec struct {
	// Name is a registered filter or scorer.
	Name string `yaml:"name"`
	// Weight multiplies a scorer's raw value (0 or unset: 1). Filters take
	// none.
	Weight float64 `yaml:"weight"`
	// Args are the entry's arguments; an argument it does not know is an
	// error naming it.
	Args map[string]string `yaml:"args"`
}

// String writes s as a local router's inline worker-chain syntax
// (name=weight/arg=value) reads one entry.
func (s ScorerSpec) String() string {
	var b strings.Builder
	b.WriteString(s.Name)
	if s.Weight != 0 {
		b.WriteByte('=')
		b.WriteString(strconv.FormatFloat(s.Weight, 'g', -1, 64))
	}
	for _, k := range slices.Sorted(maps.Keys(s.Args)) {
		fmt.Fprintf(&b, "/%s=%s", k, s.Args[k])
	}
	return b.String()
}
