package globalrouter

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/policies"
)

// builtinPolicies are the names RegisterBuiltins registers: a chain made
// of them alone is known to read nothing else of a pool.
var builtinPolicies = []string{policies.NameModelMatch, policies.NameHeaderMatch, policies.NameKVOverlap, policies.NameCost,
	policies.NameFailover, policies.NameDisaggregate, policies.NameWeighted, policies.NameSessionAffinity, policies.NameSLOGrid,
	policies.NamePriority}

// Unread lists, one line each, the fields of the configuration set to
// other than their default that no policy of its chains (the live one and
// the shadow's) reads: a pool's weight, read by the weighted policy only.
// A chain with a policy other than the built-ins (app.WithPolicy) may read
// any candidate field: nothing is listed then. kvgate policy check prints
// these lines as warnings, and kvgate extproc logs them at each load;
// empty: every field set takes effect.
func (c *Config) Unread() []string {
	names := map[string]bool{}
	chains := [][]policies.Spec{c.Chain}
	if c.Shadow != nil {
		chains = append(chains, c.Shadow.Chain)
	}
	var order []string
	for _, ch := range chains {
		for _, s := range ch {
			if !slices.Contains(builtinPolicies, s.Name) {
				return nil
			}
			if !names[s.Name] {
				order = append(order, s.Name)
			}
			names[s.Name] = true
		}
	}
	if names[policies.NameWeighted] {
		return nil
	}
	var out []string
	for _, p := range c.Pools {
		if p.Weight != 1 && p.Weight != 0 {
			out = append(out, fmt.Sprintf("%s: pool %q: weight %v is read by the %s policy only, which the chain (%s) does not run",
				c.file(), p.Name, p.Weight, policies.NameWeighted, strings.Join(order, ", ")))
		}
	}
	return out
}
