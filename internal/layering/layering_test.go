package layering

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const module = "github.com/kvgate/kvgate"

// watchSources stats every directory and Go file of the module (from the
// directory holding go.mod): go test caches a passing result keyed by the
// files a test reads, and the graph comes from a go list subprocess it
// cannot see, so without this a new upward import would be answered by a
// cached pass.
func watchSources(t *testing.T) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.HasSuffix(path, ".go") || d.Name() == "go.mod" {
			_, err = os.Stat(path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// graph is the module's import graph as `go list -deps` reports it
// (non-test files; the module's packages only).
func graph(t *testing.T) []Package {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the layering test reads the import graph with the go command: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-deps", "-f", `{{if not .Standard}}{{.ImportPath}}|{{join .Imports " "}}|{{join .Deps " "}}{{end}}`, module+"/...")
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	own := func(paths string) []string {
		var rel []string
		for _, p := range strings.Fields(paths) {
			if r, ok := strings.CutPrefix(p, module+"/"); ok {
				rel = append(rel, r)
			}
		}
		return rel
	}
	seen := map[string]bool{}
	var pkgs []Package
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "|", 3)
		if len(f) != 3 {
			continue
		}
		path, ok := strings.CutPrefix(f[0], module+"/")
		if !ok || seen[path] {
			continue
		}
		seen[path] = true
		pkgs = append(pkgs, Package{Path: path, Imports: own(f[1]), Deps: own(f[2])})
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages of %s, want the whole module:\n%s", len(pkgs), module, out)
	}
	return pkgs
}

// TestLayering fails on any edge of the module's import graph that breaks
// DESIGN.md §2's rules (Rules).
func TestLayering(t *testing.T) {
	watchSources(t)
	pkgs := graph(t)
	for _, v := range Check(pkgs) {
		t.Error(v)
	}
	// The rules name packages that must exist: a rename that leaves a
	// rule matching nothing would let it pass silently.
	have := map[string]bool{}
	for _, p := range pkgs {
		have[p.Path] = true
	}
	for _, p := range []string{"api/routing", "localrouter/client", "pool", "policies", "globalrouter", "extproc", "localrouter", "localrouter/server", "kvevents", "lib/config", "cmd/kvgate"} {
		if !have[p] {
			t.Errorf("package %s is gone: update the rules (layering.go) and docs/architecture.md", p)
		}
	}
}

// TestCheckCatches proves the checker fails: each fake edge breaks one
// rule, and a graph of allowed edges passes.
func TestCheckCatches(t *testing.T) {
	for _, tt := range []struct {
		name string
		pkg  Package
		want []string // "from to direct" of the violations
	}{
		{"pool imports the core", Package{Path: "pool", Imports: []string{"localrouter"}, Deps: []string{"localrouter"}},
			[]string{"pool localrouter true"}},
		{"pool links the server through another package", Package{Path: "pool", Imports: []string{"membership"}, Deps: []string{"membership", "localrouter/server"}},
			[]string{"pool localrouter/server false"}},
		{"globalrouter links the core", Package{Path: "globalrouter", Imports: []string{"pool"}, Deps: []string{"pool", "localrouter"}},
			[]string{"globalrouter localrouter false"}},
		{"the client links the core", Package{Path: "localrouter/client", Imports: []string{"localrouter"}, Deps: []string{"localrouter"}},
			[]string{"localrouter/client localrouter true"}},
		{"upward: pool imports globalrouter", Package{Path: "pool", Imports: []string{"globalrouter"}, Deps: []string{"globalrouter"}},
			[]string{"pool globalrouter true"}},
		{"upward: api imports the client", Package{Path: "api/routing", Imports: []string{"localrouter/client"}, Deps: []string{"localrouter/client"}},
			[]string{"api/routing localrouter/client true", "api/routing localrouter/client true"}},
		{"policies imports a router package", Package{Path: "policies", Imports: []string{"pool"}, Deps: []string{"pool"}},
			[]string{"policies pool true"}},
		{"a library imports internal/", Package{Path: "extproc", Imports: []string{"internal/status"}, Deps: []string{"internal/status"}},
			[]string{"extproc internal/status true"}},
		{"something imports cmd/", Package{Path: "internal/up", Imports: []string{"cmd/kvgate"}, Deps: []string{"cmd/kvgate"}},
			[]string{"internal/up cmd/kvgate true"}},
		{"the core imports the client side", Package{Path: "localrouter", Imports: []string{"pool"}, Deps: []string{"pool"}},
			[]string{"localrouter pool true"}},
		{"kvevents imports the local router", Package{Path: "kvevents", Imports: []string{"localrouter"}, Deps: []string{"localrouter"}},
			[]string{"kvevents localrouter true"}},
		{"lib/ is a leaf", Package{Path: "lib/config", Imports: []string{"membership"}, Deps: []string{"membership"}},
			[]string{"lib/config membership true"}},
		{"allowed: the chain downward", Package{Path: "extproc", Imports: []string{"globalrouter", "lib/config"}, Deps: []string{"globalrouter", "pool", "policies", "localrouter/client", "api/routing", "lib/config"}},
			nil},
		{"allowed: processes import anything", Package{Path: "internal/extprocd", Imports: []string{"extproc", "internal/status", "localrouter"}, Deps: []string{"extproc", "internal/status", "localrouter", "localrouter/server"}},
			nil},
		{"allowed: the in-process adapter joins pool and the core", Package{Path: "localrouter/inproc", Imports: []string{"pool", "localrouter", "localrouter/server"}, Deps: []string{"pool", "localrouter", "localrouter/server"}},
			nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, v := range Check([]Package{tt.pkg}) {
				got = append(got, v.From+" "+v.To+" "+map[bool]string{true: "true", false: "false"}[v.Direct])
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}
