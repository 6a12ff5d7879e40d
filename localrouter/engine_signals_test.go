package localrouter

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// best is BestWorker with its signals report.
func best(t *testing.T, r *Router, req Request, opts BestWorkerOptions) (routing.Selection, SignalsReport) {
	t.Helper()
	var rep SignalsReport
	opts.Signals = &rep
	sel, err := r.BestWorker(testenv.Context(t), req, opts)
	if err != nil {
		t.Fatal(err)
	}
	return sel, rep
}

func TestBestWorkerSkipsSaturatedEngine(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	cfg.SaturationKVUsage = 0.95
	cfg.SaturationWaiting = 10
	r := newRouter(t, cfg, "a", "b", "c")
	prompt := toks(32, 1)
	// a holds the whole prompt: without engine signals it always wins.
	storeTokens(t, r, "a", prompt)
	sel, rep := best(t, r, Request{Tokens: prompt}, BestWorkerOptions{})
	if sel.WorkerID != "a" || len(rep.Skipped) != 0 || rep.HasEngine {
		t.Fatalf("before signals: %+v, %+v; want a, nothing skipped", sel, rep)
	}

	tests := []struct {
		name     string
		a        signals.Sample
		wantID   string
		wantSkip string // substring of a's skip reason
	}{
		{"kv full with a queue", signals.Sample{Engine: "vllm", KVUsage: 0.97, HasKVUsage: true, Waiting: 1}, "", "KV usage 0.970"},
		{"long queue", signals.Sample{Engine: "vllm", Waiting: 10}, "", "10 requests waiting"},
		{"kv full, no queue: not saturated", signals.Sample{Engine: "vllm", KVUsage: 0.99, HasKVUsage: true}, "a", ""},
		{"short queue", signals.Sample{Engine: "sglang", Waiting: 9}, "a", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.SetEngineSignals("a", map[uint32]signals.Sample{0: tt.a, 5: tt.a}) // rank 5 is not a's: ignored
			sel, rep := best(t, r, Request{Tokens: prompt}, BestWorkerOptions{})
			if tt.wantSkip == "" {
				if sel.WorkerID != tt.wantID || len(rep.Skipped) != 0 || !rep.HasEngine || rep.Engine != tt.a {
					t.Errorf("got %+v, %+v; want %s with its engine signals, nothing skipped", sel, rep, tt.wantID)
				}
				return
			}
			if sel.WorkerID == "a" {
				t.Errorf("chose saturated worker a: %+v", sel)
			}
			if len(rep.Skipped) != 1 || rep.Skipped[0].Worker != (WorkerKey{ID: "a", DPRank: 0}) || !strings.Contains(rep.Skipped[0].Reason, tt.wantSkip) {
				t.Errorf("skipped = %+v, want a with a reason containing %q", rep.Skipped, tt.wantSkip)
			}
		})
	}
	if _, ok := r.EngineSignals(WorkerKey{ID: "a", DPRank: 5}); ok {
		t.Error("signals of a rank beyond dp_size were kept")
	}
	// One rank reported by a one-rank worker is its rank 0, whatever its
	// label (vLLM's external DP load balancing).
	r.SetEngineSignals("b", map[uint32]signals.Sample{3: {Engine: "vllm", Waiting: 1}})
	if got, ok := r.EngineSignals(WorkerKey{ID: "b", DPRank: 0}); !ok || got.Waiting != 1 {
		t.Errorf("b rank 0 = %+v, %v; want the one rank its engine reported", got, ok)
	}
	r.SetEngineSignals("b", nil)

	// A forced worker is never skipped; every worker saturated skips none.
	sat := signals.Sample{Engine: "vllm", Waiting: 50}
	r.SetEngineSignals("a", map[uint32]signals.Sample{0: sat})
	sel, rep = best(t, r, Request{Tokens: prompt}, BestWorkerOptions{Worker: &WorkerKey{ID: "a", DPRank: 0}})
	if sel.WorkerID != "a" || len(rep.Skipped) != 0 {
		t.Errorf("forced worker: %+v, %+v; want a, nothing skipped", sel, rep)
	}
	r.SetEngineSignals("b", map[uint32]signals.Sample{0: sat})
	r.SetEngineSignals("c", map[uint32]signals.Sample{0: sat})
	sel, rep = best(t, r, Request{Tokens: prompt}, BestWorkerOptions{RequestID: "r1"})
	if sel.WorkerID != "a" || !rep.AllSaturated || len(rep.Skipped) != 0 {
		t.Errorf("all saturated: %+v, %+v; want a (cheapest), AllSaturated, nothing skipped", sel, rep)
	}

	// Placing a request counts its skips; probes do not.
	r.SetEngineSignals("b", nil)
	best(t, r, Request{Tokens: prompt}, BestWorkerOptions{RequestID: "r2"})
	if got := r.SaturationSkips(); got != 2 {
		t.Errorf("SaturationSkips = %d, want 2 (a and c for r2)", got)
	}
	// Without a report the choice is the same.
	if sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{}); err != nil || sel.WorkerID != "b" {
		t.Errorf("without a report: %+v, %v; want b", sel, err)
	}

	// Removing a worker forgets its signals.
	r.RemoveWorker("c")
	if _, ok := r.EngineSignals(WorkerKey{ID: "c", DPRank: 0}); ok {
		t.Error("signals of a removed worker were kept")
	}
}

func TestEngineSignalsInCost(t *testing.T) {
	cfg := DefaultConfig()
	cfg.WorkerChain = CostWorkerChain() // Dynamo's formula, asked for
	cfg.BlockSize = 4
	prompt := toks(16, 1)
	// Equal cost without signals; a's engine has a queue and a fuller cache.
	load := map[uint32]signals.Sample{0: {Engine: "vllm", Waiting: 3, KVUsage: 0.5, HasKVUsage: true}}

	t.Run("weights 0: cost unchanged", func(t *testing.T) {
		r := newRouter(t, cfg, "a")
		before, _ := best(t, r, Request{Tokens: prompt}, BestWorkerOptions{})
		r.SetEngineSignals("a", load)
		after, _ := best(t, r, Request{Tokens: prompt}, BestWorkerOptions{})
		if before.ChainScore != after.ChainScore {
			t.Errorf("cost %v with signals, %v without; want equal at weights 0", after.ChainScore, before.ChainScore)
		}
	})
	t.Run("weights steer away", func(t *testing.T) {
		c := cfg
		c.WaitingWeight, c.KVUsageWeight = 2, 10
		r := newRouter(t, c, "a", "b")
		r.SetEngineSignals("a", load)
		for i := range 20 { // ties are broken at random: b must win every time
			if sel, _ := best(t, r, Request{Tokens: prompt}, BestWorkerOptions{}); sel.WorkerID != "b" {
				t.Fatalf("try %d: %+v; want b", i, sel)
			}
		}
		loads, err := r.PotentialLoads(testenv.Context(t), Request{Tokens: prompt})
		if err != nil || len(loads) != 2 || !loads[0].HasEngine || loads[0].Engine.Waiting != 3 || loads[1].HasEngine {
			t.Errorf("PotentialLoads = %+v, %v; want a's engine signals on a only", loads, err)
		}
		a, _ := best(t, r, Request{Tokens: prompt}, BestWorkerOptions{Worker: &WorkerKey{ID: "a", DPRank: 0}})
		b, _ := best(t, r, Request{Tokens: prompt}, BestWorkerOptions{Worker: &WorkerKey{ID: "b", DPRank: 0}})
		if got, want := a.ChainScore-b.ChainScore, 2*3+10*0.5; got != want {
			t.Errorf("engine term = %v, want waiting_weight*3 + kv_usage_weight*0.5 = %v", got, want)
		}
	})
}

func TestConfigRefusesBadSignalKnobs(t *testing.T) {
	for _, mut := range []func(*Config){
		func(c *Config) { c.WaitingWeight = -1 },
		func(c *Config) { c.KVUsageWeight = -1 },
		func(c *Config) { c.SaturationKVUsage = 1.5 },
		func(c *Config) { c.SaturationWaiting = -1 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
}
