package pool_test

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/pool"
)

func TestDecodeWorkerChain(t *testing.T) {
	dir := t.TempDir()
	got, err := decode(t, dir, `
- name: a
  models: [m]
  routers: {etcd: true}
  worker_chain:
    - name: saturation
    - {name: cost, weight: 1}
    - name: cold
      weight: 0.5
      args: {lru_size: 64}
`)
	if err != nil {
		t.Fatal(err)
	}
	if s := localrouter.FormatWorkerChain(got[0].WorkerChain); s != "saturation,cost=1,cold=0.5/lru_size=64" {
		t.Errorf("worker chain %q", s)
	}
	for _, tt := range []struct{ name, chain, want string }{
		{"unknown scorer", "    - name: prefx\n", `pools.yaml:5:7: pool "a": worker_chain[0]: worker chain entry 1: unknown filter or scorer "prefx"`},
		{"unknown arg", "    - name: cost\n    - {name: cold, args: {size: 3}}\n", `pools.yaml:6:7: pool "a": worker_chain[1]: worker chain "cold": unknown argument "size" (known: lru_size)`},
		{"unknown key", "    - {name: cost, wieght: 2}\n", `pools.yaml:5:20: pools[0].worker_chain[0]: unknown field "wieght"`},
		{"filters only", "    - name: saturation\n", `pools.yaml:5:5: pool "a": worker_chain: worker chain has no scorer`},
		{"bad weight", "    - {name: cost, weight: -2}\n", `weight -2 must be > 0`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeChecked(t, dir, "- name: a\n  models: [m]\n  routers: {etcd: true}\n  worker_chain:\n"+tt.chain)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
		})
	}
	// The shape is Validate's own (no registry needed): from a file, the
	// error points at the entry.
	if _, err := decode(t, dir, "- name: a\n  models: [m]\n  routers: {etcd: true}\n  worker_chain:\n    - name: cost\n    - name: cost\n"); err == nil ||
		!strings.Contains(err.Error(), `pools.yaml:6:7: pool "a": worker_chain[1]: "cost" named twice`) {
		t.Errorf("a name twice: %v", err)
	}
	// Built in Go: the error names the field.
	c := pool.NewConfig("g", 16, []string{"m"}, "127.0.0.1:1")
	c.WorkerChain = []routing.ScorerSpec{{Name: "nope"}}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate (the chain's shape only): %v", err)
	}
	if err := c.CheckWorkerChain(localrouter.PoolChainCheck(nil)); err == nil || !strings.Contains(err.Error(), `pool "g": worker_chain: worker chain entry 1: unknown filter or scorer "nope"`) {
		t.Errorf("CheckWorkerChain: %v", err)
	}
}

// decodeChecked is decode, then each pool's worker chain checked against
// the local router's built-in scorers (what the ext_proc assembly and
// kvgate policy check do).
func decodeChecked(t *testing.T, dir, text string) ([]pool.Config, error) {
	t.Helper()
	cfgs, err := decode(t, dir, text)
	if err != nil {
		return nil, err
	}
	for i := range cfgs {
		if err := cfgs[i].CheckWorkerChain(localrouter.PoolChainCheck(nil)); err != nil {
			return nil, err
		}
	}
	return cfgs, nil
}
