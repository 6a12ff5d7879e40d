package localrouter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// oldChoice is BestWorker's choice as it was before the worker chain
// (router.go at 188278f), written out: Dynamo's cost with the tier credit
// and the engine-signal term, the saturation filter (none skipped when all
// are saturated), the cheapest with reservoir tie-breaking drawing from
// rnd exactly as Router.pick does. It returns the chosen worker and its
// cost.
func oldChoice(t *testing.T, r *Router, req Request, rnd *rand.Rand) (WorkerKey, float64) {
	t.Helper()
	loads, err := r.PotentialLoads(testenv.Context(t), req)
	if err != nil {
		t.Fatal(err)
	}
	local, err := kvevents.AppendRequestHashes(nil, req.Tokens, r.cfg.BlockSize, req.LoRAName, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var m Matches
	r.index.FindMatches(local, &m)
	cfg := r.cfg
	isl := len(req.Tokens)
	costs := make([]float64, len(loads))
	var kept []int
	for j, l := range loads {
		overlap := float64(l.OverlapBlocks)
		if tm, ok := m.TiersOf(l.Worker); ok && len(m.Tiers) > 0 {
			overlap = max(overlap, cfg.tierCredit(tm))
		}
		prefillBlocks := float64(activePrefill(l, isl, cfg.BlockSize)+isl) / float64(cfg.BlockSize)
		c := cfg.PrefillLoadScale * max(0, prefillBlocks-cfg.OverlapScoreCredit*overlap)
		if cfg.TrackActiveBlocks {
			c += float64(l.PotentialDecodeBlocks)
		}
		if l.HasEngine {
			c += cfg.WaitingWeight*l.Engine.Waiting + cfg.KVUsageWeight*l.Engine.KVUsage
		}
		costs[j] = c
		if l.Saturation == "" {
			kept = append(kept, j)
		}
	}
	if len(kept) == 0 {
		for j := range loads {
			kept = append(kept, j)
		}
	}
	best, ties := kept[0], 1
	if len(kept) > 1 {
		for _, j := range kept[1:] {
			switch {
			case costs[j] < costs[best]:
				best, ties = j, 1
			case costs[j] == costs[best]:
				ties++
				if rnd.IntN(ties) == 0 {
					best = j
				}
			}
		}
	}
	return loads[best].Worker, costs[best]
}

// TestCostChainIsTheOldFormula: over random pools (cached prefixes on
// the GPU and the CPU tier, requests in prefill and decode, engine
// signals with saturation, random cost parameters) Dynamo's chain
// (CostWorkerChain, the default before the ttft scorer; the default chain
// is TestDefaultChainIsSaturationThenTTFT's) chooses what the formula it
// replaced chooses, at the same cost (ChainScore), with the same
// tie-breaks (both draw from equally seeded sources).
func TestCostChainIsTheOldFormula(t *testing.T) {
	gen := rand.New(rand.NewPCG(7, 7))
	for round := 0; round < 40; round++ {
		cfg := DefaultConfig()
		cfg.WorkerChain = CostWorkerChain() // Dynamo's formula, asked for
		cfg.BlockSize = 4
		cfg.PredictedTTL = 0 // predicted entries' recosting has its own tests (predicted_test.go)
		cfg.OverlapScoreCredit = float64(gen.IntN(4))
		cfg.PrefillLoadScale = float64(gen.IntN(3))
		cfg.TrackActiveBlocks = gen.IntN(4) != 0
		if gen.IntN(2) == 0 {
			cfg.WaitingWeight, cfg.KVUsageWeight = float64(gen.IntN(3)), float64(gen.IntN(20))
			cfg.SaturationWaiting, cfg.SaturationKVUsage = 1+gen.IntN(4), 0.9
		}
		seed := uint64(round)
		r, err := New(cfg, Options{Rand: rand.New(rand.NewPCG(seed, 1)), SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		ref := rand.New(rand.NewPCG(seed, 1))
		n := 2 + gen.IntN(5)
		workers := make([]string, n)
		for i := range workers {
			workers[i] = fmt.Sprintf("w%d", i)
			r.AddWorker(workers[i], 1+gen.IntN(2))
		}
		prompts := make([][]uint32, 4)
		for i := range prompts {
			prompts[i] = toks(8+4*gen.IntN(8), uint32(1000*i))
		}
		for step := 0; step < 60; step++ {
			w := WorkerKey{ID: workers[gen.IntN(n)], DPRank: 0}
			p := prompts[gen.IntN(len(prompts))]
			switch gen.IntN(5) {
			case 0: // the worker caches a prefix of p, on the GPU or the CPU
				k := 4 * (1 + gen.IntN(len(p)/4))
				var blocks []kvevents.Block
				for i := 0; i+4 <= k; i += 4 {
					blocks = append(blocks, kvevents.Block{EngineHash: uint64(step*100 + i), TokenIDs: p[i : i+4]})
				}
				medium := ""
				if gen.IntN(3) == 0 {
					medium = "CPU_PINNED"
				}
				if err := r.ApplyEvent(kvevents.RouterEvent{WorkerID: w.ID, Event: kvevents.Event{Stored: &kvevents.Stored{Medium: medium, Blocks: blocks}}}); err != nil {
					t.Fatal(err)
				}
			case 1: // a request placed there (forced: no draw), maybe past prefill
				id := fmt.Sprintf("r%d-%d", round, step)
				if _, err := r.Commit(testenv.Context(t), id, w, Request{Tokens: p}); err != nil {
					t.Fatal(err)
				}
				if gen.IntN(2) == 0 {
					_ = r.MarkPrefillComplete(testenv.Context(t), id)
				}
			case 2: // engine signals
				if cfg.SaturationWaiting > 0 {
					r.SetEngineSignals(w.ID, map[uint32]signals.Sample{0: {Engine: "vllm", Waiting: float64(gen.IntN(5)), Running: float64(gen.IntN(5)), KVUsage: gen.Float64(), HasKVUsage: true}})
				}
			default: // a decision, compared
				req := Request{Tokens: p}
				sel, err := r.BestWorker(testenv.Context(t), req, BestWorkerOptions{})
				if err != nil {
					t.Fatal(err)
				}
				want, wantCost := oldChoice(t, r, req, ref)
				if Selected(sel) != want || sel.ChainScore != wantCost || len(sel.Scores) != 0 {
					t.Fatalf("round %d step %d (cfg %+v): chain chose %v at cost %g (scores %v), the old formula %v at %g", round, step, cfg, Selected(sel), sel.ChainScore, sel.Scores, want, wantCost)
				}
			}
		}
		r.Close()
	}
}

// TestDefaultChainIsSaturationThenTTFT: a Config without a WorkerChain
// ranks exactly as one naming DefaultWorkerChain, saturation then the ttft
// scorer: same choice, same ChainScore (the ttft prediction in blocks of
// prefill time, which Cost holds in milliseconds), same tie-breaks.
func TestDefaultChainIsSaturationThenTTFT(t *testing.T) {
	if got := FormatWorkerChain(DefaultWorkerChain()); got != "saturation,ttft=1" {
		t.Fatalf("DefaultWorkerChain = %s, want saturation,ttft=1", got)
	}
	gen := rand.New(rand.NewPCG(3, 3))
	mk := func(chain []ScorerSpec, seed uint64) *Router {
		cfg := DefaultConfig()
		cfg.BlockSize, cfg.WorkerChain, cfg.SaturationWaiting = 4, chain, 2
		r, err := New(cfg, Options{Rand: rand.New(rand.NewPCG(seed, 1)), SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	def, named := mk(nil, 9), mk(DefaultWorkerChain(), 9)
	for _, r := range []*Router{def, named} {
		for _, w := range []string{"a", "b", "c"} {
			r.AddWorker(w, 1)
		}
	}
	blockMs := DefaultTTFTPrefillMillis / DefaultTTFTChunk * 4
	for step := range 80 {
		p := toks(8+4*gen.IntN(8), uint32(1000*gen.IntN(3)))
		w := WorkerKey{ID: []string{"a", "b", "c"}[gen.IntN(3)], DPRank: 0}
		switch gen.IntN(4) {
		case 0:
			k := 4 * (1 + gen.IntN(len(p)/4))
			for _, r := range []*Router{def, named} {
				storeTokens(t, r, w.ID, p[:k])
			}
		case 1:
			waiting := float64(gen.IntN(4))
			for _, r := range []*Router{def, named} {
				r.SetEngineSignals(w.ID, map[uint32]signals.Sample{0: {Engine: "vllm", Waiting: waiting}})
			}
		default:
			id := fmt.Sprint("r", step)
			a, err := def.BestWorker(testenv.Context(t), Request{Tokens: p}, BestWorkerOptions{RequestID: id})
			if err != nil {
				t.Fatal(err)
			}
			b, err := named.BestWorker(testenv.Context(t), Request{Tokens: p}, BestWorkerOptions{RequestID: id})
			if err != nil {
				t.Fatal(err)
			}
			if Selected(a) != Selected(b) || a.ChainScore != b.ChainScore || a.Cost != b.Cost || len(a.Scores) != 0 {
				t.Fatalf("step %d: the default chain chose %v (score %g, cost %g, scores %v), saturation,ttft %v (score %g, cost %g)",
					step, Selected(a), a.ChainScore, a.Cost, a.Scores, Selected(b), b.ChainScore, b.Cost)
			}
			if d := a.ChainScore*blockMs - a.Cost; math.Abs(d) > 1e-9*a.Cost {
				t.Fatalf("step %d: ChainScore %g blocks of prefill time is %g ms, Cost %g ms", step, a.ChainScore, a.ChainScore*blockMs, a.Cost)
			}
		}
	}
}

func chainRouter(t *testing.T, chain string, mod func(*Config)) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	specs, err := ParseWorkerChain(chain)
	if err != nil {
		t.Fatal(err)
	}
	cfg.WorkerChain = specs
	if mod != nil {
		mod(&cfg)
	}
	return newRouter(t, cfg, "a", "b", "c")
}

func TestChainReportsEachScore(t *testing.T) {
	r := chainRouter(t, "cost=1,prefix=10,decode=2", nil)
	prompt := toks(32, 1)
	storeTokens(t, r, "b", prompt[:16]) // b holds half the prompt
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != "b" || len(sel.Scores) != 3 {
		t.Fatalf("got %+v, want b with three scores", sel)
	}
	var total float64
	for i, name := range []string{"cost", "prefix", "decode"} {
		s := sel.Scores[i]
		if s.Name != name || s.Contribution != s.Raw*s.Weight {
			t.Errorf("score %d: %+v, want %s with contribution raw*weight", i, s, name)
		}
		total += s.Contribution
	}
	// b: cost = prefill 8 - 4 cached + 8 decode blocks = 12; prefix -4/8;
	// decode: all three hold 8 blocks with the request: 1.
	if got := sel.Scores[0].Raw; got != 12 {
		t.Errorf("cost raw %g, want 12", got)
	}
	if got := sel.Scores[1].Raw; got != -0.5 {
		t.Errorf("prefix raw %g, want -0.5", got)
	}
	if got := sel.Scores[2].Raw; got != 1 {
		t.Errorf("decode raw %g, want 1", got)
	}
	if total != 12-5+2 || sel.ChainScore != total {
		t.Errorf("total %g, ChainScore %g; want 9", total, sel.ChainScore)
	}
}

func TestPrefixScorerAloneFollowsTheCache(t *testing.T) {
	r := chainRouter(t, "prefix", nil)
	prompt := toks(32, 1)
	storeTokens(t, r, "c", prompt[:8])
	// Load c heavily: the prefix scorer alone does not care.
	for i := 0; i < 5; i++ {
		if _, err := r.Commit(testenv.Context(t), fmt.Sprint("x", i), WorkerKey{ID: "c", DPRank: 0}, Request{Tokens: toks(64, uint32(5000+100*i))}); err != nil {
			t.Fatal(err)
		}
	}
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != "c" || sel.Scores[0].Raw != -0.25 {
		t.Errorf("got %+v, want c at prefix -0.25", sel)
	}
}

func TestLoadScorersNormalise(t *testing.T) {
	in := &ChainInput{ISL: 8, BlockSize: 4, Loads: []PotentialLoad{
		{Worker: WorkerKey{ID: "a", DPRank: 0}, PotentialPrefillTokens: 8, PotentialDecodeBlocks: 2},
		{Worker: WorkerKey{ID: "b", DPRank: 0}, PotentialPrefillTokens: 28, PotentialDecodeBlocks: 8, HasEngine: true, Engine: signals.Sample{Waiting: 4, Running: 2, KVUsage: 0.5, HasKVUsage: true}},
		{Worker: WorkerKey{ID: "c", DPRank: 0}, PotentialPrefillTokens: 18, PotentialDecodeBlocks: 4, HasEngine: true, Engine: signals.Sample{Waiting: 2, Running: 4}},
	}}
	cand := []int{0, 1, 2}
	for _, tt := range []struct {
		s    Scorer
		want []float64
	}{
		{prefillLoad, []float64{0, 1, 0.5}}, // active prefill 0, 20, 10
		{decodeLoad, []float64{0.25, 1, 0.5}},
		{waitingLoad, []float64{0, 1, 0.5}},
		{runningLoad, []float64{0, 0.5, 1}},
		{kvUsageScorer{}, []float64{0, 0.5, 0}},
	} {
		out := make([]float64, 3)
		tt.s.Score(in, cand, out)
		for i := range out {
			if math.Abs(out[i]-tt.want[i]) > 1e-12 {
				t.Errorf("%T %v: got %v, want %v", tt.s, tt.s, out, tt.want)
				break
			}
		}
	}
	// All idle: 0 for all, no division by zero.
	idle := &ChainInput{Loads: []PotentialLoad{{}, {}}}
	out := []float64{9, 9}
	waitingLoad.Score(idle, []int{0, 1}, out)
	if out[0] != 0 || out[1] != 0 {
		t.Errorf("idle: %v, want zeros", out)
	}
}

func TestColdScorerSpreadsColdPrompts(t *testing.T) {
	// Cold prompts only, and a prefix scorer that cannot tell them apart:
	// the cold spreader sends each to the worker least recently given one.
	r := chainRouter(t, "prefix,cold", nil)
	seen := map[string]int{}
	for i := 0; i < 9; i++ {
		sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, uint32(10000*(i+1)))}, BestWorkerOptions{RequestID: fmt.Sprint("q", i)})
		if err != nil {
			t.Fatal(err)
		}
		seen[sel.WorkerID]++
	}
	if seen["a"] != 3 || seen["b"] != 3 || seen["c"] != 3 {
		t.Errorf("cold prompts landed %v, want 3 on each", seen)
	}
	// A prompt with a hit somewhere is not cold: the spreader is neutral.
	prompt := toks(16, 1)
	storeTokens(t, r, "a", prompt)
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != "a" || sel.Scores[1].Raw != 0 {
		t.Errorf("warm prompt: %+v, want a with cold 0", sel)
	}
}

func TestColdScorerProbesDoNotMoveTheOrder(t *testing.T) {
	r := chainRouter(t, "cold", nil)
	first, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 1)}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, uint32(100*i+50))}, BestWorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sel.Scores[0].Raw != 0 {
			t.Fatalf("probe %d: cold raw %g, want 0 (nothing placed yet)", i, sel.Scores[0].Raw)
		}
	}
	if _, err := r.Commit(testenv.Context(t), "c1", Selected(first), Request{Tokens: toks(16, 1)}); err != nil {
		t.Fatal(err)
	}
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 7777)}, BestWorkerOptions{Worker: &WorkerKey{ID: first.WorkerID, DPRank: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if sel.Scores[0].Raw != 0 { // forced: the only candidate
		t.Errorf("forced: raw %g", sel.Scores[0].Raw)
	}
}

func TestSessionScorerSticksWithinBounds(t *testing.T) {
	r := chainRouter(t, "session,decode=0.1", nil)
	req := Request{Tokens: toks(16, 1), SessionKey: "conversation-42"}
	sel, err := r.BestWorker(testenv.Context(t), req, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	home := sel.WorkerID
	for i := 0; i < 5; i++ {
		s, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, uint32(900*i+100)), SessionKey: "conversation-42"}, BestWorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.WorkerID != home {
			t.Fatalf("session moved from %s to %s on an idle pool", home, s.WorkerID)
		}
	}
	// Overload the home worker past (1 + slack) × the mean: the session moves.
	for i := 0; i < 3; i++ {
		if _, err := r.Commit(testenv.Context(t), fmt.Sprint("load", i), WorkerKey{ID: home, DPRank: 0}, Request{Tokens: toks(200, uint32(50000+1000*i))}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := r.BestWorker(testenv.Context(t), req, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.WorkerID == home {
		t.Errorf("session stayed on overloaded %s", home)
	}
	// Sessions spread: many keys do not all hash to one worker.
	homes := map[string]bool{}
	r2 := chainRouter(t, "session", nil)
	for i := 0; i < 30; i++ {
		s, err := r2.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 1), SessionKey: fmt.Sprint("s", i)}, BestWorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		homes[s.WorkerID] = true
	}
	if len(homes) != 3 {
		t.Errorf("30 sessions used %d of 3 workers", len(homes))
	}
}

func TestLoRAFilterAndScorer(t *testing.T) {
	r := chainRouter(t, "lora,saturation,cost", nil)
	prompt := toks(16, 1)
	// a is the least loaded, but lacks the adapter (the LoRA name is in
	// the block hashes: no cache is shared with the base model's).
	for _, w := range []string{"b", "c"} {
		if _, err := r.Commit(testenv.Context(t), "busy-"+w, WorkerKey{ID: w, DPRank: 0}, Request{Tokens: toks(64, 7000)}); err != nil {
			t.Fatal(err)
		}
	}
	r.SetEngineSignals("b", map[uint32]signals.Sample{0: {Engine: "vllm", HasLoRA: true, LoRARunning: "base,sql"}})
	r.SetEngineSignals("c", map[uint32]signals.Sample{0: {Engine: "vllm", HasLoRA: true, LoRAWaiting: "chat"}})
	var rep SignalsReport
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt, LoRAName: "sql"}, BestWorkerOptions{Signals: &rep})
	if err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != "b" || len(rep.Skipped) != 2 || !strings.Contains(rep.Skipped[0].Reason, "sql not loaded") {
		t.Errorf("sql: got %s, skipped %+v; want b, a and c skipped", sel.WorkerID, rep.Skipped)
	}
	// An adapter no worker has: nothing filtered, the cheapest wins.
	sel, _ = best(t, r, Request{Tokens: prompt, LoRAName: "nowhere"}, BestWorkerOptions{})
	if sel.WorkerID != "a" {
		t.Errorf("unknown adapter: got %s, want a (nothing filtered)", sel.WorkerID)
	}
	// The scorer: running 0, waiting 0.5, elsewhere 1.
	in := &ChainInput{LoRA: "chat", Loads: []PotentialLoad{{}, {HasEngine: true, Engine: signals.Sample{HasLoRA: true, LoRARunning: "chat"}}, {HasEngine: true, Engine: signals.Sample{HasLoRA: true, LoRAWaiting: "x,chat"}}}}
	out := make([]float64, 3)
	loraScorer{}.Score(in, []int{0, 1, 2}, out)
	if out[0] != 1 || out[1] != 0 || out[2] != 0.5 {
		t.Errorf("lora-affinity: %v, want [1 0 0.5]", out)
	}
}

func TestCostScorerArgs(t *testing.T) {
	r := chainRouter(t, "cost/credit=8/scale=4/normalize=max", nil)
	if c := r.Config(); c.OverlapScoreCredit != 8 || c.PrefillLoadScale != 4 {
		t.Errorf("credit %g scale %g, want 8 and 4", c.OverlapScoreCredit, c.PrefillLoadScale)
	}
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 1)}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel.Scores[0].Raw != 1 { // all equal: each is the max
		t.Errorf("normalised cost %g, want 1", sel.Scores[0].Raw)
	}
}

// TestDefaultChainAllocatesNothing: the default chain's decision path
// allocates nothing per request (BenchmarkBestWorker measures it too).
func TestDefaultChainAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	r := newRouter(t, DefaultConfig(), "a", "b", "c", "d")
	req := Request{Tokens: toks(256, 1)}
	ctx := testenv.Context(t)
	if _, err := r.BestWorker(ctx, req, BestWorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() { _, _ = r.BestWorker(ctx, req, BestWorkerOptions{}) }); n != 0 {
		t.Errorf("BestWorker allocates %v times per call under the default chain", n)
	}
}

// FuzzParseWorkerChain: any text is an error or a chain that formats and
// parses back to itself; validation never panics.
func BenchmarkBestWorkerChain(b *testing.B) {
	for _, chain := range []string{"", "saturation,cost=1/normalize=max,prefix=1,prefill=0.5,decode=0.5,cold=0.3"} {
		name := chain
		if name == "" {
			name = "default"
		}
		b.Run(name, func(b *testing.B) {
			cfg := DefaultConfig()
			specs, err := ParseWorkerChain(chain)
			if err != nil {
				b.Fatal(err)
			}
			cfg.WorkerChain = specs
			r, err := New(cfg, Options{SweepInterval: -1})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			for w := 0; w < 64; w++ {
				r.AddWorker(fmt.Sprintf("w%02d", w), 1)
			}
			prompts := make([][]uint32, 256)
			for i := range prompts {
				prompts[i] = toks(1024, uint32(i%16)*100000+uint32(i/16)*7)
				var blocks []kvevents.Block
				for k := 0; k+16 <= len(prompts[i]); k += 16 {
					blocks = append(blocks, kvevents.Block{EngineHash: uint64(i<<20 + k), TokenIDs: prompts[i][k : k+16]})
				}
				if err := r.ApplyEvent(kvevents.RouterEvent{WorkerID: fmt.Sprintf("w%02d", i%64), Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: blocks}}}); err != nil {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := r.BestWorker(ctx, Request{Tokens: prompts[i%len(prompts)]}, BestWorkerOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzDecodeWorkerChain: any YAML is an error naming the file, or a chain
// that validates; never a panic.
