package runner_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestNATSReconnectsForever (issue 13 item 5): a client from NATS.Connect
// never gives up reconnecting, and waits and buffers as documented.
func TestNATSReconnectsForever(t *testing.T) {
	url := testenv.StartNATS(t)
	nc, err := (runner.NATS{URL: url}).Connect("test", quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.Opts.MaxReconnect; got != -1 {
		t.Errorf("MaxReconnect = %d, want -1 (forever)", got)
	}
	if got := nc.Opts.ReconnectWait; got != runner.NATSReconnectWait {
		t.Errorf("ReconnectWait = %v, want %v", got, runner.NATSReconnectWait)
	}
	if got := nc.Opts.ReconnectBufSize; got != runner.NATSReconnectBufSize {
		t.Errorf("ReconnectBufSize = %d, want %d", got, runner.NATSReconnectBufSize)
	}
	if !nc.Opts.AllowReconnect {
		t.Error("AllowReconnect = false")
	}
}

// TestEveryClientFromRunner: outside tests and this package, no kvgate
// code builds a NATS or etcd client itself: all go through NATS.Connect and
// Etcd.Client, so every one reconnects as documented.
func TestEveryClientFromRunner(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := map[string]string{"nats.Connect": "runner.NATS.Connect", "clientv3.New": "runner.Etcd.Client"}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "internal/runner", "internal/testenv", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok {
				if use, bad := forbidden[x.Name+"."+sel.Sel.Name]; bad {
					t.Errorf("%s: %s.%s: build the client with %s", fset.Position(sel.Pos()), x.Name, sel.Sel.Name, use)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
