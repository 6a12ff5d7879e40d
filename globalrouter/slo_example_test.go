package globalrouter_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/tokenizer"
)

// TestExampleSLOConfig loads examples/pools-slo.yaml, checks that every
// pool its slo-grid and priority arguments name is one of its pools, and
// routes a few requests through its chain.
func TestExampleSLOConfig(t *testing.T) {
	reg := builtins(t)
	cfg, err := globalrouter.LoadConfig("../examples/pools-slo.yaml", reg)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	var names []string
	roles := map[string]policies.Role{}
	for _, p := range cfg.Pools {
		names = append(names, p.Name)
		roles[p.Name] = p.Role
	}
	chain, err := reg.Build(cfg.Chain, nil, policies.KnownPools(names...))
	if err != nil {
		t.Fatalf("Build with the example's pools known: %v", err)
	}

	// Every pool answers; the cheapest are the bulk pools, so what ranks
	// first is the grid's and the priority's doing.
	cost := map[string]float64{"prefill-fast": 9, "prefill-bulk": 1, "decode-fast": 9, "decode-bulk": 1, "decode-reserved": 5}
	cands := func(prefillTokens int) []policies.Candidate {
		var out []policies.Candidate
		for _, n := range names {
			out = append(out, policies.Candidate{Pool: n, Role: roles[n], Models: []string{"llama-3-8b"}, Weight: 1,
				Probe: routing.Selection{WorkerID: n + "-0", BlockSize: 16, Cost: cost[n], ISL: 4000, PrefillTokens: prefillTokens}})
		}
		return out
	}
	req := func(isl, priority int, ttftMs, itlMs int) *policies.Request {
		return &policies.Request{Model: "llama-3-8b", ISL: isl, Priority: priority,
			SLO: policies.SLO{TTFT: time.Duration(ttftMs) * time.Millisecond, ITL: time.Duration(itlMs) * time.Millisecond}}
	}
	tests := []struct {
		name string
		req  *policies.Request
		want []string
	}{
		{"short prompt, tight targets", req(4000, 0, 100, 20), []string{"decode-fast+prefill-fast", "decode-bulk+prefill-fast"}},
		{"defaults: TTFT 500 ms, ITL 40 ms", req(4000, 0, 0, 0), []string{"decode-bulk+prefill-bulk", "decode-fast+prefill-bulk"}},
		{"high priority: the reserved pool", req(4000, 10, 0, 0), []string{"decode-reserved+prefill-bulk", "decode-bulk+prefill-bulk", "decode-fast+prefill-bulk"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var trace policies.Trace
			got, err := chain.Rank(tt.req, cands(0), &trace)
			if err != nil {
				t.Fatalf("Rank: %v", err)
			}
			var pools []string
			for _, c := range got {
				p := c.Pool
				if c.Prefill != nil {
					p += "+" + c.Prefill.Pool
				}
				pools = append(pools, p)
			}
			if diff := cmp.Diff(tt.want, pools); diff != "" {
				t.Errorf("ranking (-want +got):\n%s\ntrace: %s", diff, &trace)
			}
		})
	}
	if _, err := chain.Rank(req(4000, -1, 0, 0), cands(40000), nil); !errors.Is(err, policies.ErrSaturated) {
		t.Errorf("low priority on loaded pools: got %v, want ErrSaturated", err)
	}
	if _, err := chain.Rank(req(4000, 0, 0, 0), cands(40000), nil); err != nil {
		t.Errorf("default priority on loaded pools: got %v, want no shedding", err)
	}
}

// TestSLOPoliciesDecide routes real requests through real local routers
// with slo-grid and priority in the chain: the SLO and priority headers
// pick the pool, and a shed request is ErrSaturated (429).
func TestSLOPoliciesDecide(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	grid, prio := policies.SLOGridArgs{
		Decode: &policies.DecodeGrid{ITLMsBuckets: []float64{30}, Pools: [][]policies.Cell{{{"pool-b"}, {"pool-a"}}}},
	}, policies.PriorityArgs{
		Tiers: []policies.PriorityTier{{MinPriority: new(5), Pools: []string{"pool-a"}}},
		// Every worker has the prompt to prefill: more than 1 token.
		Shed: &policies.PriorityShed{MaxPriority: new(-1), MaxPrefillTokens: 1},
	}
	cfg.Chain = []policies.Spec{{Name: "model-match"}, {Name: "cost"},
		{Name: "slo-grid", Args: policies.SectionOf(grid)}, {Name: "priority", Args: policies.SectionOf(prio)}}
	r, _ := newRouter(t, cfg)

	tests := []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"tight ITL", map[string]string{globalrouter.HeaderITL: "10"}, "pool-b"},
		{"loose ITL", map[string]string{globalrouter.HeaderITL: "30"}, "pool-a"},
		{"no ITL: the middle column", nil, "pool-a"},
		{"tight ITL, high priority", map[string]string{globalrouter.HeaderITL: "10", globalrouter.HeaderPriority: "5"}, "pool-a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat("route me by my targets")...), Headers: tt.headers})
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			free(t, d)
			if d.Primary.Pool != tt.want || len(d.Fallbacks) == 0 {
				t.Errorf("primary %s with %d fallbacks, want %s with fallbacks", d.Primary.Pool, len(d.Fallbacks), tt.want)
			}
		})
	}
	_, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat("shed me")...), Headers: map[string]string{globalrouter.HeaderPriority: "-1"}})
	if !errors.Is(err, globalrouter.ErrSaturated) {
		t.Errorf("low priority on loaded pools: got %v, want ErrSaturated", err)
	}
}

// TestLoadConfigRefusesUnknownPoolInPolicy: a pool name in slo-grid that no
// pool has is an error at load time, naming the file and the name.
func TestLoadConfigRefusesUnknownPoolInPolicy(t *testing.T) {
	raw, err := os.ReadFile("../examples/pools-slo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(raw), "prefill-fast", "prefill-fsat", 1)
	if bad == string(raw) {
		t.Fatal("example has no prefill-fast to misspell")
	}
	path := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = globalrouter.LoadConfig(path, builtins(t))
	if err == nil {
		t.Fatal("LoadConfig accepted a misspelt pool name")
	}
	if !strings.Contains(err.Error(), "prefill-fsat") || !strings.Contains(err.Error(), "pools.yaml") {
		t.Errorf("error %q does not name the file and the unknown pool", err)
	}
}
