package localrouter

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newRouter(t *testing.T, cfg Config, workers ...string) *Router {
	t.Helper()
	r, err := New(cfg, Options{Rand: rand.New(rand.NewPCG(1, 2)), SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	for _, w := range workers {
		r.AddWorker(w, 1)
	}
	return r
}

func toks(n int, base uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

// storeTokens reports tokens as stored on worker w, one chain.
func storeTokens(t *testing.T, r *Router, w string, tokens []uint32) {
	t.Helper()
	bs := r.Config().BlockSize
	var blocks []kvevents.Block
	for i := 0; i+bs <= len(tokens); i += bs {
		blocks = append(blocks, kvevents.Block{EngineHash: uint64(1000 + i), TokenIDs: tokens[i : i+bs]})
	}
	if err := r.ApplyEvent(kvevents.RouterEvent{WorkerID: w, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: blocks}}}); err != nil {
		t.Fatal(err)
	}
}

func TestBestWorkerPrefersCachedPrefix(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "a", "b", "c")
	prompt := toks(64, 0)
	storeTokens(t, r, "b", prompt[:48])
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != "b" || sel.OverlapBlocks != 12 {
		t.Errorf("BestWorker = %+v, want worker b with 12 overlap blocks", sel)
	}
	// A pure query changes nothing.
	if st := r.Active().Stats(); st.Requests != 0 {
		t.Errorf("query recorded %d requests, want 0", st.Requests)
	}
	if sel.RequestBlocks != 16 || sel.Candidates != 3 {
		t.Errorf("RequestBlocks %d Candidates %d, want 16, 3", sel.RequestBlocks, sel.Candidates)
	}
}

func TestCostFormula(t *testing.T) {
	p := costParams{credit: 1, scale: 1, trackBlocks: true}
	tests := []struct {
		name                                    string
		p                                       costParams
		activePrefill, isl, bs, overlap, decode int
		want                                    float64
	}{
		{"idle, no cache", p, 0, 64, 16, 0, 4, 4 + 4},
		{"fully cached", p, 0, 64, 16, 4, 4, 0 + 4},
		{"queued prefill", p, 160, 64, 16, 0, 4, 14 + 4},
		{"credit halves overlap", costParams{credit: 0.5, scale: 1, trackBlocks: true}, 0, 64, 16, 4, 4, 2 + 4},
		{"scale doubles prefill", costParams{credit: 1, scale: 2, trackBlocks: true}, 0, 64, 16, 0, 4, 8 + 4},
		{"no block tracking", costParams{credit: 1, scale: 1}, 0, 64, 16, 0, 4, 4},
		{"overlap beyond prefill clamps to 0", p, 0, 16, 16, 4, 1, 0 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.cost(tt.activePrefill, tt.isl, tt.bs, float64(tt.overlap), tt.decode); got != tt.want {
				t.Errorf("cost = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLifecycleShiftsLoad(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "a", "b")
	ctx := testenv.Context(t)
	// Two different prompts: the second goes to the idle worker.
	s1, err := r.BestWorker(ctx, Request{Tokens: toks(40, 0)}, BestWorkerOptions{RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := r.BestWorker(ctx, Request{Tokens: toks(40, 1000)}, BestWorkerOptions{RequestID: "r2"})
	if err != nil {
		t.Fatal(err)
	}
	if Selected(s1) == Selected(s2) {
		t.Errorf("both requests on %v; the second should avoid the loaded worker", Selected(s1))
	}
	if got := r.Active().Load(Selected(s1)); got != (WorkerLoad{PrefillTokens: 40, ActiveBlocks: 10, ActiveRequests: 1}) {
		t.Errorf("load after add = %+v", got)
	}
	if err := r.MarkPrefillComplete(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := r.MarkPrefillComplete(ctx, "r1"); err != nil {
		t.Errorf("second MarkPrefillComplete: %v, want idempotent", err)
	}
	if got := r.Active().Load(Selected(s1)); got.PrefillTokens != 0 || got.ActiveBlocks != 10 {
		t.Errorf("load after prefill = %+v, want 0 prefill, 10 blocks", got)
	}
	for _, id := range []string{"r1", "r2"} {
		if err := r.Free(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Free(ctx, "r1"); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("second Free = %v, want ErrUnknownRequest", err)
	}
	if st := r.Active().Stats(); st.Requests != 0 || st.UnknownOps != 1 {
		t.Errorf("stats = %+v, want 0 requests, 1 unknown op", st)
	}
	if got := r.Active().Load(Selected(s1)); got != (WorkerLoad{}) {
		t.Errorf("load after free = %+v, want zero", got)
	}
}

func TestPotentialLoadsSharedBlocksCountOnce(t *testing.T) {
	a := NewActiveSequences()
	w := WorkerKey{ID: "a", DPRank: 0}
	now := time.Now()
	seq := []uint64{1, 2, 3, 4}
	if err := a.Add(now, "r1", w, seq, 16, 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := a.Add(now, "r2", w, []uint64{1, 2, 9}, 12, 2, 4); err != nil {
		t.Fatal(err)
	}
	if err := a.Add(now, "r2", w, seq, 16, 0, 4); !errors.Is(err, ErrDuplicateRequest) {
		t.Errorf("duplicate Add = %v, want ErrDuplicateRequest", err)
	}
	// Active: {1,2,3,4,9} = 5 distinct; prefill 16 + (12-8) = 20.
	got := a.PotentialLoads(nil, []WorkerKey{w, {ID: "b", DPRank: 0}}, []uint64{1, 2, 3, 7}, 16, 4, []int{3, 0})
	want := []PotentialLoad{
		{Worker: w, PotentialPrefillTokens: 4 + 20, PotentialDecodeBlocks: 5 + 1, OverlapBlocks: 3, ActiveRequests: 2},
		{Worker: WorkerKey{ID: "b", DPRank: 0}, PotentialPrefillTokens: 16, PotentialDecodeBlocks: 4},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PotentialLoads (-want +got):\n%s", diff)
	}
	// Forced expiry frees what is older than the bound.
	if ids := a.Expire(now.Add(301*time.Second), 300*time.Second); len(ids) != 2 {
		t.Errorf("Expire freed %v, want both", ids)
	}
	if st := a.Stats(); st.Requests != 0 || st.Expired != 2 {
		t.Errorf("after expiry: %+v", st)
	}
}

func TestTiesBrokenUniformly(t *testing.T) {
	r := newRouter(t, DefaultConfig(), "a", "b", "c", "d")
	counts := map[string]int{}
	for i := 0; i < 4000; i++ {
		sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(32, 0)}, BestWorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		counts[sel.WorkerID]++
	}
	for w, n := range counts {
		if n < 800 || n > 1200 {
			t.Errorf("worker %s chosen %d of 4000 times, want about 1000 (counts %v)", w, n, counts)
		}
	}
	if len(counts) != 4 {
		t.Errorf("only %d workers ever chosen: %v", len(counts), counts)
	}
}

func TestTemperatureSamples(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "a", "b")
	storeTokens(t, r, "a", toks(64, 0))
	pick := func(temp float64) map[string]int {
		counts := map[string]int{}
		for i := 0; i < 2000; i++ {
			sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(64, 0)}, BestWorkerOptions{Override: &routing.Override{RouterTemperature: &temp}})
			if err != nil {
				t.Fatal(err)
			}
			counts[sel.WorkerID]++
		}
		return counts
	}
	if c := pick(0); c["b"] != 0 {
		t.Errorf("temperature 0 chose the uncached worker %d times", c["b"])
	}
	c := pick(1)
	if c["b"] == 0 || c["a"] <= c["b"] {
		t.Errorf("temperature 1: counts %v, want both chosen, the cached one more", c)
	}
	neg := -1.0
	if _, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(8, 0)}, BestWorkerOptions{Override: &routing.Override{RouterTemperature: &neg}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("negative temperature: %v, want ErrInvalidConfig", err)
	}
}

func TestBadRequests(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinInitialWorkers = 2
	r := newRouter(t, cfg, "a")
	ctx := testenv.Context(t)
	if _, err := r.BestWorker(ctx, Request{Tokens: toks(32, 0)}, BestWorkerOptions{}); !errors.Is(err, ErrNotReady) {
		t.Errorf("below min workers: %v, want ErrNotReady", err)
	}
	r.AddWorker("b", 1)
	if !r.Ready() {
		t.Error("not ready with 2 workers")
	}
	tests := []struct {
		name string
		req  Request
		opts BestWorkerOptions
		want error
	}{
		{"empty", Request{}, BestWorkerOptions{}, ErrEmptyRequest},
		{"wrong block size", Request{LocalHashes: []uint64{1}, BlockSize: 32}, BestWorkerOptions{}, ErrBlockSizeMismatch},
		{"unknown forced worker", Request{Tokens: toks(16, 0)}, BestWorkerOptions{Worker: &WorkerKey{ID: "zz", DPRank: 0}}, ErrUnknownWorker},
		{"dp rank out of range", Request{Tokens: toks(16, 0)}, BestWorkerOptions{Worker: &WorkerKey{ID: "a", DPRank: 1}}, ErrUnknownWorker},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := r.BestWorker(ctx, tt.req, tt.opts); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	if err := r.ApplyEvent(kvevents.RouterEvent{WorkerID: "ghost", Event: kvevents.Event{Cleared: true}}); !errors.Is(err, ErrUnknownWorker) {
		t.Errorf("event of non-member: %v, want ErrUnknownWorker", err)
	}
	if _, err := New(Config{}, Options{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("zero config: %v, want ErrInvalidConfig", err)
	}
	// A partial block only: routable by load, no hashes.
	if sel, err := r.BestWorker(ctx, Request{Tokens: toks(5, 0)}, BestWorkerOptions{}); err != nil || sel.RequestBlocks != 0 {
		t.Errorf("partial block: %+v, %v", sel, err)
	}
}

func TestRemoveWorkerDropsState(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "a", "b")
	ctx := testenv.Context(t)
	storeTokens(t, r, "a", toks(16, 0))
	if _, err := r.Commit(ctx, "r1", WorkerKey{ID: "a", DPRank: 0}, Request{Tokens: toks(16, 0)}); err != nil {
		t.Fatal(err)
	}
	if ids := r.RemoveWorker("a"); len(ids) != 1 || ids[0] != "r1" {
		t.Errorf("RemoveWorker freed %v, want [r1]", ids)
	}
	if got := r.Index().TreeSize(WorkerKey{ID: "a", DPRank: 0}); got != 0 {
		t.Errorf("tree size after removal = %d", got)
	}
	if diff := cmp.Diff([]WorkerKey{{ID: "b", DPRank: 0}}, r.Workers()); diff != "" {
		t.Errorf("workers (-want +got):\n%s", diff)
	}
}

func TestApproximateModeLearnsFromCommits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	cfg.UseKVEvents = false
	r := newRouter(t, cfg, "a", "b")
	ctx := testenv.Context(t)
	s1, err := r.BestWorker(ctx, Request{Tokens: toks(64, 0)}, BestWorkerOptions{RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	r.Free(ctx, "r1")
	s2, err := r.BestWorker(ctx, Request{Tokens: toks(64, 0)}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if Selected(s2) != Selected(s1) || s2.OverlapBlocks != 16 {
		t.Errorf("second request %+v, want worker %v with 16 blocks", s2, Selected(s1))
	}
}

func TestRoutersCloseIndependently(t *testing.T) {
	a, err := New(DefaultConfig(), Options{SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(DefaultConfig(), Options{SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.AddWorker("w", 1)
	a.Close()
	a.Close() // idempotent
	if _, err := a.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 0)}, BestWorkerOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("closed router: %v, want ErrClosed", err)
	}
	if _, err := b.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 0)}, BestWorkerOptions{RequestID: "x"}); err != nil {
		t.Errorf("closing a broke b: %v", err)
	}
	if err := b.Free(testenv.Context(t), "x"); err != nil {
		t.Errorf("b.Free: %v", err)
	}
}

func TestSweepExpiresRequests(t *testing.T) {
	now := time.Unix(0, 0)
	cfg := DefaultConfig()
	r, _ := New(cfg, Options{Clock: func() time.Time { return now }, SweepInterval: -1})
	defer r.Close()
	r.AddWorker("a", 1)
	if _, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 0)}, BestWorkerOptions{RequestID: "r"}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(299 * time.Second)
	if ids := r.Sweep(); len(ids) != 0 {
		t.Errorf("swept %v before expiry", ids)
	}
	now = now.Add(2 * time.Second)
	if ids := r.Sweep(); len(ids) != 1 {
		t.Errorf("swept %v, want [r]", ids)
	}
}

// TestNoEventsAfterRemoval races event appliers against RemoveWorker: once
// RemoveWorker returns, the removed worker holds nothing.
func TestNoEventsAfterRemoval(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "a")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			r.ApplyEvent(kvevents.RouterEvent{WorkerID: "a", Event: kvevents.Event{Stored: &kvevents.Stored{
				Blocks: []kvevents.Block{{EngineHash: uint64(i), TokenIDs: toks(4, uint32(i*4))}}}}})
		}
	}()
	r.RemoveWorker("a")
	<-done
	if got := r.Index().TreeSize(WorkerKey{ID: "a", DPRank: 0}); got != 0 {
		t.Errorf("removed worker holds %d blocks", got)
	}
}

func TestOverridesRejectNaNAndInf(t *testing.T) {
	r := newRouter(t, DefaultConfig(), "a")
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1} {
		v := v
		for name, o := range map[string]*routing.Override{
			"credit": {OverlapScoreCredit: &v}, "scale": {PrefillLoadScale: &v}, "temperature": {RouterTemperature: &v},
		} {
			if _, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 0)}, BestWorkerOptions{Override: o}); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%s override %v: got %v, want ErrInvalidConfig", name, v, err)
			}
		}
	}
	cfg := DefaultConfig()
	cfg.RouterTemperature = math.NaN()
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NaN temperature in config: got %v, want ErrInvalidConfig", err)
	}
}

// TestUpdateIndexerIgnoredWithKVEvents: with KV events the index is the
// engine's; a decision recorded there would expire later and drop a block
// the engine still holds.
func TestUpdateIndexerIgnoredWithKVEvents(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	now := time.Unix(1000, 0)
	r, err := New(cfg, Options{Clock: func() time.Time { return now }, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.AddWorker("a", 1)
	prompt := toks(8, 0)
	if _, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{UpdateIndexer: true}); err != nil {
		t.Fatal(err)
	}
	storeTokens(t, r, "a", prompt)
	now = now.Add(time.Hour) // past any approximate TTL
	r.Sweep()
	if got := r.Index().TreeSize(WorkerKey{ID: "a", DPRank: 0}); got != 2 {
		t.Errorf("tree size after the TTL = %d, want the engine's 2 blocks", got)
	}
}

// TestShrinkingDPSizeDropsRanks: ranks a worker no longer has lose their
// blocks and requests, so a later growth starts them empty.
func TestShrinkingDPSizeDropsRanks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg)
	r.AddWorker("a", 2)
	ev := kvevents.RouterEvent{WorkerID: "a", DPRank: 1, Event: kvevents.Event{Stored: &kvevents.Stored{
		Blocks: []kvevents.Block{{EngineHash: 1, TokenIDs: toks(4, 0)}}}}}
	if err := r.ApplyEvent(ev); err != nil {
		t.Fatal(err)
	}
	rank1 := WorkerKey{ID: "a", DPRank: 1}
	if _, err := r.Commit(testenv.Context(t), "q", rank1, Request{Tokens: toks(8, 0)}); err != nil {
		t.Fatal(err)
	}
	r.AddWorker("a", 1)
	if got := r.Index().TreeSize(rank1); got != 0 {
		t.Errorf("dropped rank still holds %d blocks", got)
	}
	if _, ok := r.Active().Has("q"); ok {
		t.Error("dropped rank's request still active")
	}
	r.AddWorker("a", 2)
	if got := r.Index().TreeSize(rank1); got != 0 {
		t.Errorf("regrown rank holds %d blocks, want 0", got)
	}
}
