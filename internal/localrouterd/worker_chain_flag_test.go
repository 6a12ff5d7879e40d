package localrouterd

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/localrouter"
)

func TestWorkerChainFlag(t *testing.T) {
	base := []string{"--pool", "p", "--etcd", "e:1", "--nats-url", "n", "--router-id", "r"}
	dir := t.TempDir()
	file := filepath.Join(dir, "chain.yaml")
	if err := os.WriteFile(file, []byte("- name: saturation\n- {name: cost, args: {normalize: max}}\n- {name: cold, weight: 0.5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(bad, []byte("- name: cost\n- {name: cold, args: {lru: 3}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want string // the chain, formatted, or an error's text
	}{
		{"none", nil, nil, ""},
		{"inline", []string{"--worker-chain", "saturation,cost=1,prefix=2/"}, nil, `argument "" is not key=value`},
		{"inline ok", []string{"--worker-chain=saturation,cost=1,prefix=2"}, nil, "saturation,cost=1,prefix=2"},
		{"env", nil, map[string]string{"KVGATE_WORKER_CHAIN": "decode"}, "decode"},
		{"file", []string{"--worker-chain", file}, nil, "saturation,cost/normalize=max,cold=0.5"},
		{"@file", []string{"--worker-chain", "@" + file}, nil, "saturation,cost/normalize=max,cold=0.5"},
		{"bad file", []string{"--worker-chain", bad}, nil, `bad.yml:2:3: worker_chain[1]: worker chain "cold": unknown argument "lru" (known: lru_size)`},
		{"unknown scorer", []string{"--worker-chain", "cost,prefixx"}, nil, `unknown filter or scorer "prefixx"`},
		{"missing file", []string{"--worker-chain", filepath.Join(dir, "none.yaml")}, nil, "worker chain file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseFlags("localrouter", append(append([]string{}, base...), tt.args...), func(k string) string { return tt.env[k] }, io.Discard)
			got := ""
			if err != nil {
				got = err.Error()
			} else {
				got = localrouter.FormatWorkerChain(c.Router.WorkerChain)
			}
			if (tt.want == "" && got != "") || !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// countScorer is a scorer of this test's own: a worker's requests in flight.
type countScorer struct{}

func (countScorer) Score(in *localrouter.ChainInput, cand []int, out []float64) {
	for k, j := range cand {
		out[k] = float64(in.Loads[j].ActiveRequests)
	}
}

// TestWorkerChainFlagScorers: a scorer added to a registry (app.WithScorer)
// is accepted by -worker-chain and carried to the router's Config; the
// built-ins alone refuse it, and the shared built-ins are not changed.
func TestWorkerChainFlagScorers(t *testing.T) {
	args := []string{"--pool", "p", "--etcd", "e:1", "--nats", "n", "--router-id", "r", "--worker-chain", "saturation,count=1"}
	reg := localrouter.BuiltinScorers()
	if err := reg.RegisterScorer("count", func(*localrouter.ChainArgs) (localrouter.Scorer, error) { return countScorer{}, nil }); err != nil {
		t.Fatal(err)
	}
	if err := reg.RegisterScorer("count", func(*localrouter.ChainArgs) (localrouter.Scorer, error) { return countScorer{}, nil }); err == nil {
		t.Error("a name registered twice: no error")
	}
	c, err := ParseFlagsWith("localrouter", args, func(string) string { return "" }, io.Discard, reg)
	if err != nil {
		t.Fatalf("with the scorer registered: %v", err)
	}
	if got := localrouter.FormatWorkerChain(c.Router.WorkerChain); got != "saturation,count=1" || c.Router.Scorers != reg {
		t.Errorf("chain %q, scorers %p; want saturation,count=1 and %p", got, c.Router.Scorers, reg)
	}
	if _, err := ParseFlags("localrouter", args, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), `unknown filter or scorer "count"`) {
		t.Errorf("the built-ins alone: %v, want count refused", err)
	}
	if _, err := ParseFlagsWith("localrouter", args, func(string) string { return "" }, io.Discard, localrouter.BuiltinScorers()); err == nil {
		t.Error("a fresh BuiltinScorers() knows count: registries are not independent")
	}
}
