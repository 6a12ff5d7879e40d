// Package layering is DESIGN.md §2's import rules as code: Check reads a
// module's import graph (each package's direct imports and its transitive
// dependencies, as `go list -deps` reports them, test files excluded) and
// returns every edge that breaks a rule. layering_test.go runs it on this
// module, so `go test` (and `make test`) fails on a new upward edge.
// docs/architecture.md draws the graph the rules allow.
package layering

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Package is one package of the module: its path relative to the module
// (".../kvgate/pool" is "pool"), the module's packages it imports directly
// and the module's packages it links (its transitive dependencies).
type Package struct {
	Path    string
	Imports []string
	Deps    []string
}

// Violation is one edge that breaks a rule.
type Violation struct {
	Rule     string
	From, To string
	// Direct is whether From imports To itself (else it links it through
	// another package).
	Direct bool
}

func (v Violation) String() string {
	how := "links"
	if v.Direct {
		how = "imports"
	}
	return fmt.Sprintf("%s %s %s: %s", v.From, how, v.To, v.Rule)
}

// floors is the request path's downward-only chain: a package may import
// its own floor or lower ones, never a higher one. extproc →
// globalrouter → {pool, policies} → localrouter/client → api.
var floors = []struct {
	floor int
	pkgs  []string // a path, or a prefix ending in "/..."
}{
	{0, []string{"api/..."}},
	{1, []string{"localrouter/client"}},
	{2, []string{"pool", "policies"}},
	{3, []string{"globalrouter", "globalrouter/..."}},
	{4, []string{"extproc"}},
}

// clientSide never links the local router's core, its server, or the
// packages only they use: the vocabulary both sides share is api/'s.
var clientSide = []string{"extproc", "globalrouter", "globalrouter/...", "pool", "policies", "localrouter/client"}

// routerSide is the local router's core and what only the router process
// links.
var routerSide = []string{"localrouter", "localrouter/server", "localrouter/events", "localrouter/replica", "localrouter/inproc"}

// routerPackages are every package that routes: policies/ imports none.
var routerPackages = []string{"localrouter", "localrouter/...", "pool", "pool/...", "globalrouter", "globalrouter/...", "extproc", "extproc/..."}

// topFloor may import internal/: the binary, the processes themselves and
// the public entry point that runs them (app).
var topFloor = []string{"cmd/...", "internal/...", "app", "app/..."}

func match(path string, patterns []string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "/..."); ok {
			if path == prefix || strings.HasPrefix(path, prefix+"/") {
				return true
			}
		} else if path == p {
			return true
		}
	}
	return false
}

func floorOf(path string) (int, bool) {
	for _, f := range floors {
		if match(path, f.pkgs) {
			return f.floor, true
		}
	}
	return 0, false
}

// Rules are the rules Check applies, by name, each a test of one edge
// (from imports or links to; direct says which).
var Rules = []struct {
	Name string
	// Broken reports whether the edge breaks the rule.
	Broken func(from, to string, direct bool) bool
}{
	{"imports run downward: extproc → globalrouter → {pool, policies} → localrouter/client → api", func(from, to string, direct bool) bool {
		ff, ok1 := floorOf(from)
		tf, ok2 := floorOf(to)
		return direct && ok1 && ok2 && tf > ff
	}},
	{"the local router's core imports kvevents, never the client side", func(from, to string, direct bool) bool {
		return direct && match(from, []string{"localrouter", "kvevents", "kvevents/..."}) && match(to, append([]string{"localrouter/client"}, clientSide...))
	}},
	{"kvevents is below the local router", func(from, to string, direct bool) bool {
		return direct && match(from, []string{"kvevents", "kvevents/..."}) && match(to, []string{"localrouter", "localrouter/..."})
	}},
	{"nothing imports cmd/", func(from, to string, direct bool) bool {
		return direct && match(to, []string{"cmd/..."})
	}},
	{"the client side (extproc, globalrouter, pool, policies, localrouter/client) never links the local router's core or server", func(from, to string, direct bool) bool {
		return match(from, clientSide) && match(to, routerSide)
	}},
	{"policies/ imports no router package", func(from, to string, direct bool) bool {
		return match(from, []string{"policies", "policies/..."}) && match(to, routerPackages)
	}},
	{"only internal/, cmd/ and app/ import internal/ (process assembly lives there, never in a library package)", func(from, to string, direct bool) bool {
		return direct && match(to, []string{"internal/..."}) && !match(from, topFloor)
	}},
	{"lib/ is a leaf: it imports nothing of kvgate but lib/", func(from, to string, direct bool) bool {
		return direct && match(from, []string{"lib/..."}) && !match(to, []string{"lib/..."})
	}},
	{"api/ is the vocabulary: it imports nothing of kvgate but api/", func(from, to string, direct bool) bool {
		return direct && match(from, []string{"api/..."}) && !match(to, []string{"api/..."})
	}},
}

// Check returns every edge of pkgs that breaks a rule, sorted. A
// transitive edge is reported only when no direct edge already says it.
func Check(pkgs []Package) []Violation {
	var out []Violation
	for _, p := range pkgs {
		for _, r := range Rules {
			for _, to := range p.Imports {
				if r.Broken(p.Path, to, true) {
					out = append(out, Violation{Rule: r.Name, From: p.Path, To: to, Direct: true})
				}
			}
			for _, to := range p.Deps {
				if !slices.Contains(p.Imports, to) && r.Broken(p.Path, to, false) {
					out = append(out, Violation{Rule: r.Name, From: p.Path, To: to})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].From != out[j].From {
			return out[i].From < out[j].From
		}
		if out[i].To != out[j].To {
			return out[i].To < out[j].To
		}
		return out[i].Rule < out[j].Rule
	})
	return out
}
