package localrouter

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
)

// chain returns the Stored event of blocks with token values vs on worker
// w, engine hashes from eh up, under parent.
func chain(w string, parent *uint64, eh uint64, bs int, vs ...uint32) kvevents.RouterEvent {
	var blocks []kvevents.Block
	for i, v := range vs {
		blocks = append(blocks, blk(eh+uint64(i), v, bs))
	}
	return stored(w, parent, blocks...)
}

func mustApply(t *testing.T, ix *Index, ev kvevents.RouterEvent) {
	t.Helper()
	if err := ix.Apply(ev); err != nil {
		t.Fatal(err)
	}
}

func TestPredictedConfirmedByStoredEvent(t *testing.T) {
	const bs = 4
	ix, _ := NewIndex(bs, IndexOptions{PredictedTTL: time.Second})
	a := WorkerKey{ID: "a", DPRank: 0}
	t0 := time.Unix(100, 0)
	q := hashesOf(bs, 1, 2, 3)
	ix.Predict(t0, a, q)
	if diff := cmp.Diff(map[string]int{"a/0": 3}, overlaps(ix, q)); diff != "" {
		t.Fatalf("predicted overlap (-want +got):\n%s", diff)
	}
	if got := ix.ConfirmedPrefix(a, q, 3); got != 0 {
		t.Fatalf("confirmed prefix of predicted blocks: got %d, want 0", got)
	}
	// The engine stores the first two: they become real.
	mustApply(t, ix, chain("a", nil, 10, bs, 1, 2))
	if got := ix.ConfirmedPrefix(a, q, 3); got != 2 {
		t.Fatalf("confirmed prefix after Stored: got %d, want 2", got)
	}
	st := ix.PredictedStats()
	if want := (PredictedStats{Entries: 1, Recorded: 3, Confirmed: 2}); st != want {
		t.Fatalf("stats: got %+v, want %+v", st, want)
	}
	// Past the TTL the unconfirmed third goes; the confirmed two stay.
	ix.Expire(t0.Add(2 * time.Second))
	if diff := cmp.Diff(map[string]int{"a/0": 2}, overlaps(ix, q)); diff != "" {
		t.Fatalf("after expiry (-want +got):\n%s", diff)
	}
	if got := ix.Stats().Entries; got != 2 {
		t.Fatalf("entries after expiry: got %d, want 2", got)
	}
	// The engine's Removed drops its blocks as usual.
	mustApply(t, ix, removed("a", 11))
	if diff := cmp.Diff(map[string]int{"a/0": 1}, overlaps(ix, q)); diff != "" {
		t.Fatalf("after Removed (-want +got):\n%s", diff)
	}
	if got := ix.Stats().EventsRejected; got != 0 {
		t.Fatalf("rejected events: got %d, want 0", got)
	}
}

func TestPredictedNeverDropsEngineBlocks(t *testing.T) {
	const bs = 4
	ix, _ := NewIndex(bs, IndexOptions{PredictedTTL: time.Second})
	a := WorkerKey{ID: "a", DPRank: 0}
	t0 := time.Unix(100, 0)
	q := hashesOf(bs, 1, 2, 3, 4)
	mustApply(t, ix, chain("a", nil, 10, bs, 1, 2))
	// A prediction over blocks the engine holds adds only the others.
	ix.Predict(t0, a, q)
	if st := ix.PredictedStats(); st.Recorded != 2 || st.Entries != 2 {
		t.Fatalf("stats: got %+v, want 2 recorded, 2 entries", st)
	}
	// Their expiry leaves the engine's two.
	ix.Expire(t0.Add(2 * time.Second))
	if diff := cmp.Diff(map[string]int{"a/0": 2}, overlaps(ix, q)); diff != "" {
		t.Fatalf("after expiry (-want +got):\n%s", diff)
	}
	// Predicted, then stored by the engine under a parent, then removed and
	// stored again: each event keeps its meaning, and a later expiry drops
	// nothing the engine holds.
	ix.Predict(t0.Add(3*time.Second), a, q)
	mustApply(t, ix, chain("a", u64(11), 12, bs, 3))
	mustApply(t, ix, removed("a", 12))
	mustApply(t, ix, chain("a", u64(11), 20, bs, 3, 4))
	ix.Expire(t0.Add(10 * time.Second))
	if diff := cmp.Diff(map[string]int{"a/0": 4}, overlaps(ix, q)); diff != "" {
		t.Fatalf("after re-store and expiry (-want +got):\n%s", diff)
	}
	if got, want := ix.Stats().Entries, 4; got != want {
		t.Fatalf("entries: got %d, want %d", got, want)
	}
	mustApply(t, ix, removed("a", 10, 11, 20, 21))
	if got := ix.Stats(); got.Entries != 0 || got.Nodes != 0 {
		t.Fatalf("after removing everything: got %d entries, %d nodes, want 0, 0", got.Entries, got.Nodes)
	}
}

func TestPredictedDroppedByCleared(t *testing.T) {
	const bs = 4
	ix, _ := NewIndex(bs, IndexOptions{})
	a, b := WorkerKey{ID: "a", DPRank: 0}, WorkerKey{ID: "b", DPRank: 0}
	q := hashesOf(bs, 1, 2)
	now := time.Unix(100, 0)
	ix.Predict(now, a, q)
	ix.Predict(now, b, q)
	mustApply(t, ix, kvevents.RouterEvent{WorkerID: "a", Event: kvevents.Event{Cleared: true}})
	if diff := cmp.Diff(map[string]int{"b/0": 2}, overlaps(ix, q)); diff != "" {
		t.Fatalf("after a's Cleared (-want +got):\n%s", diff)
	}
	// A Stored after the clear is the engine's, not a confirmation.
	mustApply(t, ix, chain("a", nil, 1, bs, 1))
	if st := ix.PredictedStats(); st.Confirmed != 0 || st.Entries != 2 {
		t.Fatalf("stats: got %+v, want 0 confirmed, 2 entries (b's)", st)
	}
	ix.RemoveWorker("b")
	if st := ix.PredictedStats(); st.Entries != 0 {
		t.Fatalf("entries after b's removal: got %d, want 0", st.Entries)
	}
	if got := ix.Stats(); got.Entries != 1 || got.Nodes != 1 {
		t.Fatalf("index: got %d entries, %d nodes, want 1, 1", got.Entries, got.Nodes)
	}
	// The dump holds only what the engine stored.
	if got := len(ix.Dump()); got != 1 {
		t.Fatalf("dump: got %d events, want 1", got)
	}
}

func TestPredictedBound(t *testing.T) {
	const bs = 4
	ix, _ := NewIndex(bs, IndexOptions{MaxApproxEntries: 10})
	now := time.Unix(100, 0)
	for i := range 5 {
		ix.Predict(now, WorkerKey{ID: "a", DPRank: 0}, hashesOf(bs, uint32(10*i+1), uint32(10*i+2), uint32(10*i+3)))
	}
	st := ix.PredictedStats()
	if st.Entries > 10 || st.Entries+int(st.Expired) != 15 {
		t.Fatalf("stats: got %+v, want at most 10 entries and the rest expired", st)
	}
	if got := ix.Stats().Entries; got != st.Entries {
		t.Fatalf("index entries: got %d, want %d", got, st.Entries)
	}
}

// TestRouterPredictsInEventMode: a placed request's blocks are seen by the
// next decision at once, and a request placed on blocks only predicted
// there is charged their prefill.
func TestRouterPredictsInEventMode(t *testing.T) {
	ctx := testenv.Context(t)
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "a", "b")
	prompt := toks(32, 0)
	first, err := r.BestWorker(ctx, Request{Tokens: prompt}, BestWorkerOptions{RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	w := Selected(first)
	loads, err := r.PotentialLoads(ctx, Request{Tokens: prompt})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range loads {
		want := 0
		if l.Worker == w {
			want = 8
		}
		if l.OverlapBlocks != want {
			t.Fatalf("overlap of %s after r1: got %d, want %d", l.Worker, l.OverlapBlocks, want)
		}
	}
	// Forced onto the same worker, r2 is charged all 32 tokens: r1 is
	// still computing them.
	if _, err := r.Commit(ctx, "r2", w, Request{Tokens: prompt}); err != nil {
		t.Fatal(err)
	}
	if got := r.Active().Load(w).PrefillTokens; got != 64 {
		t.Fatalf("prefill tokens on %s: got %d, want 64", w, got)
	}
	// Once the engine stores them, r3 is charged nothing.
	storeTokens(t, r, w.ID, prompt)
	if _, err := r.Commit(ctx, "r3", w, Request{Tokens: prompt}); err != nil {
		t.Fatal(err)
	}
	if got := r.Active().Load(w).PrefillTokens; got != 64 {
		t.Fatalf("prefill tokens on %s after the engine stored: got %d, want 64", w, got)
	}
	if st := r.Index().PredictedStats(); st.Confirmed != 8 || st.Entries != 0 {
		t.Fatalf("predicted stats: got %+v, want 8 confirmed, 0 entries", st)
	}
	// With predictions off, the index is the events' alone.
	cfg.PredictedTTL = 0
	r2 := newRouter(t, cfg, "a", "b")
	if _, err := r2.BestWorker(ctx, Request{Tokens: prompt}, BestWorkerOptions{RequestID: "r1"}); err != nil {
		t.Fatal(err)
	}
	if got := r2.Index().Stats().Entries; got != 0 {
		t.Fatalf("index entries with predicted_ttl 0: got %d, want 0", got)
	}
}

// TestPredictedRefreshOrder: predicting a block again refreshes its TTL
// and its place in the size bound's order, oldest dropped first.
func TestPredictedRefreshOrder(t *testing.T) {
	const bs = 4
	a := WorkerKey{ID: "a", DPRank: 0}
	t0 := time.Unix(100, 0)
	p, q, r := hashesOf(bs, 1), hashesOf(bs, 2), hashesOf(bs, 3)
	t.Run("expiry", func(t *testing.T) {
		ix, _ := NewIndex(bs, IndexOptions{PredictedTTL: 10 * time.Second})
		ix.Predict(t0, a, p)
		ix.Predict(t0.Add(time.Second), a, q)
		ix.Predict(t0.Add(2*time.Second), a, p) // p refreshed: now newer than q
		ix.Expire(t0.Add(11 * time.Second))
		if got := overlaps(ix, p); got["a/0"] != 1 {
			t.Errorf("refreshed p after q's TTL: got overlaps %v, want a/0 holding it", got)
		}
		if got := overlaps(ix, q); len(got) != 0 {
			t.Errorf("q past its TTL: got overlaps %v, want none", got)
		}
		ix.Expire(t0.Add(12 * time.Second))
		if st := ix.PredictedStats(); st != (PredictedStats{Recorded: 2, Expired: 2}) {
			t.Errorf("stats: got %+v, want 2 recorded, 2 expired", st)
		}
		if st := ix.Stats(); st.Entries != 0 || st.Nodes != 0 {
			t.Errorf("index after expiry: got %d entries, %d nodes, want 0, 0", st.Entries, st.Nodes)
		}
	})
	t.Run("bound", func(t *testing.T) {
		// A bound of 2 drops down to 1 when a third entry comes: the
		// oldest by last prediction go, the refreshed p stays.
		ix, _ := NewIndex(bs, IndexOptions{MaxApproxEntries: 2})
		ix.Predict(t0, a, p)
		ix.Predict(t0, a, q)
		ix.Predict(t0, a, p)
		ix.Predict(t0, a, r)
		for _, c := range []struct {
			name string
			q    []uint64
			want int
		}{{"p", p, 0}, {"q", q, 0}, {"r", r, 1}} {
			if got := overlaps(ix, c.q)["a/0"]; got != c.want {
				t.Errorf("overlap of %s: got %d, want %d", c.name, got, c.want)
			}
		}
		ix.Predict(t0, a, p)
		ix.Predict(t0, a, r) // refreshed, so q's arrival drops p
		ix.Predict(t0, a, q)
		if got := overlaps(ix, p)["a/0"]; got != 0 {
			t.Errorf("overlap of p, the oldest: got %d, want 0", got)
		}
		if st := ix.PredictedStats(); st.Entries != 1 || st.Recorded != 5 || st.Expired != 4 {
			t.Errorf("stats: got %+v, want 1 entry, 5 recorded, 4 expired", st)
		}
	})
}

// TestPredictedSeveralWorkers: a block predicted on several workers keeps
// one entry per worker; a Stored event confirms only its own worker's, a
// Cleared drops only its own, and expiry the rest.
func TestPredictedSeveralWorkers(t *testing.T) {
	const bs = 4
	ix, _ := NewIndex(bs, IndexOptions{PredictedTTL: time.Second})
	a, b, c := WorkerKey{ID: "a", DPRank: 0}, WorkerKey{ID: "b", DPRank: 0}, WorkerKey{ID: "c", DPRank: 0}
	t0 := time.Unix(100, 0)
	q := hashesOf(bs, 1, 2)
	for _, k := range []WorkerKey{a, b, c} {
		ix.Predict(t0, k, q)
	}
	mustApply(t, ix, chain("b", nil, 10, bs, 1, 2))
	mustApply(t, ix, kvevents.RouterEvent{WorkerID: "a", Event: kvevents.Event{Cleared: true}})
	if diff := cmp.Diff(map[string]int{"b/0": 2, "c/0": 2}, overlaps(ix, q)); diff != "" {
		t.Fatalf("after b's Stored and a's Cleared (-want +got):\n%s", diff)
	}
	for _, k := range []WorkerKey{a, b, c} {
		want := 0
		if k == b {
			want = 2
		}
		if got := ix.ConfirmedPrefix(k, q, 2); got != want {
			t.Errorf("confirmed prefix of %s: got %d, want %d", k, got, want)
		}
	}
	if st := ix.PredictedStats(); st != (PredictedStats{Entries: 2, Recorded: 6, Confirmed: 2}) {
		t.Fatalf("stats: got %+v, want 2 entries (c's), 6 recorded, 2 confirmed", st)
	}
	ix.Expire(t0.Add(time.Second))
	if diff := cmp.Diff(map[string]int{"b/0": 2}, overlaps(ix, q)); diff != "" {
		t.Fatalf("after expiry (-want +got):\n%s", diff)
	}
	if st := ix.PredictedStats(); st.Entries != 0 || st.Expired != 2 {
		t.Fatalf("stats after expiry: got %+v, want 0 entries, 2 expired", st)
	}
}

// TestPredictedBoundWithinOneRequest: a request of more new blocks than
// the bound leaves, after the bound's drop and then expiry, nothing held:
// every entry dropped releases its block. (The LRU this list replaced,
// sized at the bound plus two, evicted past it on its own, without
// releasing: those blocks stayed held, as if the engine held them.)
func TestPredictedBoundWithinOneRequest(t *testing.T) {
	const bs = 4
	ix, _ := NewIndex(bs, IndexOptions{MaxApproxEntries: 2, PredictedTTL: time.Second})
	a := WorkerKey{ID: "a", DPRank: 0}
	t0 := time.Unix(100, 0)
	q := hashesOf(bs, 1, 2, 3, 4, 5, 6)
	ix.Predict(t0, a, q)
	st := ix.PredictedStats()
	if st != (PredictedStats{Entries: 1, Recorded: 6, Expired: 5}) {
		t.Fatalf("stats: got %+v, want 1 entry, 6 recorded, 5 expired", st)
	}
	if got := ix.Stats().Entries; got != 1 {
		t.Fatalf("index entries: got %d, want 1 (the newest prediction)", got)
	}
	ix.Expire(t0.Add(time.Second))
	if got := ix.Stats(); got.Entries != 0 || got.Nodes != 0 {
		t.Fatalf("after expiry: got %d entries, %d nodes, want 0, 0", got.Entries, got.Nodes)
	}
}
