package localrouter

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
)

// decodeFixture decodes one of kvevents' engine fixtures (made from vLLM's
// and SGLang's struct definitions by kvevents/testdata/vllm_gen.py).
func decodeFixture(t *testing.T, name string) []kvevents.Event {
	t.Helper()
	raw, err := os.ReadFile("../kvevents/testdata/" + name + ".msgpack")
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvevents.DecodeEnginePayload(raw, 4)
	if err != nil {
		t.Fatal(err)
	}
	return b.Events
}

func applyAll(t *testing.T, ix *Index, w string, evs []kvevents.Event) {
	t.Helper()
	for i, ev := range evs {
		if err := ix.Apply(kvevents.RouterEvent{WorkerID: w, EventID: uint64(i + 1), Event: ev}); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
}

// TestMixedValidityBatchApplies: vLLM's offloading connector sends GPU
// stores, CPU stores with token_ids=[] and removals in one batch, next to
// events kvgate cannot use. The good ones reach the index (the batch used
// to be refused whole, leaving stale blocks), the CPU copies on their tier.
func TestMixedValidityBatchApplies(t *testing.T) {
	ix, _ := NewIndex(4, IndexOptions{})
	applyAll(t, ix, "w", decodeFixture(t, "vllm_mixed_validity"))
	// Blocks 21, 22 stored on the GPU, both copied to the CPU, 22 evicted
	// from the GPU; 27 stored on the CPU under 21.
	q := []uint64{
		kvevents.BlockHash(toks(4, 600), kvevents.Seed),
		kvevents.BlockHash(toks(4, 604), kvevents.Seed),
	}
	var m Matches
	ix.FindMatches(q, &m)
	if got := m.Of(WorkerKey{ID: "w"}); got != 1 {
		t.Errorf("GPU overlap = %d, want 1 (block 22 was removed from the GPU)", got)
	}
	tm, ok := m.TiersOf(WorkerKey{ID: "w"})
	if !ok {
		t.Fatal("no per-tier match for a worker with CPU blocks")
	}
	want := [kvevents.NumTiers]int{kvevents.TierGPU: 1, kvevents.TierCPU: 1}
	if diff := cmp.Diff(want, tm.Blocks); diff != "" {
		t.Errorf("per-tier run (-want +got):\n%s", diff)
	}
	if st := ix.Stats(); st.LowerTierBlocks != 3 {
		t.Errorf("lower-tier entries = %d, want 3 (21, 22, 27 on the CPU)", st.LowerTierBlocks)
	}
	// The CPU tier survives the dump: a fresh index rebuilt from it agrees.
	again, _ := NewIndex(4, IndexOptions{})
	for _, ev := range ix.Dump() {
		if err := again.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	var m2 Matches
	again.FindMatches(q, &m2)
	if tm2, _ := m2.TiersOf(WorkerKey{ID: "w"}); tm2.Blocks != want {
		t.Errorf("after a dump round trip: %v, want %v", tm2.Blocks, want)
	}
}

// TestSaltAndImagesSeparateBlocks: a block stored with a cache_salt never
// matches an unsalted request (the engine would miss it), and two images
// behind the same placeholder tokens do not match each other.
func TestSaltAndImagesSeparateBlocks(t *testing.T) {
	ix, _ := NewIndex(4, IndexOptions{})
	applyAll(t, ix, "w", decodeFixture(t, "vllm_extra_keys"))
	w := WorkerKey{ID: "w"}
	match := func(tokens []uint32, lora, salt string, mm []kvevents.MMSpan) int {
		q, err := kvevents.RequestHashes(tokens, 4, lora, salt, mm)
		if err != nil {
			t.Fatal(err)
		}
		var m Matches
		ix.FindMatches(q, &m)
		return m.Of(w)
	}
	salted := append(toks(8, 900), toks(4, 950)...)
	if got := match(salted, "", "tenant-a", nil); got != 3 {
		t.Errorf("salted request: %d blocks, want 3 (the child store inherits the salt)", got)
	}
	if got := match(salted, "", "", nil); got != 0 {
		t.Errorf("unsalted request matched %d salted blocks, want 0", got)
	}
	if got := match(salted, "", "tenant-b", nil); got != 0 {
		t.Errorf("another tenant's salt matched %d blocks, want 0", got)
	}
	img := make([]uint32, 8)
	a, b := kvevents.MMHash("img-aaaa"), kvevents.MMHash("img-bbbb")
	if got := match(img, "chat-adapter", "", []kvevents.MMSpan{{Hash: a, Offset: 0, Length: 4}, {Hash: b, Offset: 4, Length: 4}}); got != 2 {
		t.Errorf("same images: %d blocks, want 2", got)
	}
	if got := match(img, "chat-adapter", "", []kvevents.MMSpan{{Hash: b, Offset: 0, Length: 4}}); got != 0 {
		t.Errorf("another image behind the same placeholders matched %d blocks, want 0", got)
	}
	if got := match(img, "chat-adapter", "", nil); got != 0 {
		t.Errorf("placeholders without the image matched %d blocks, want 0", got)
	}
}

// TestTierAwareCost: a worker holding the prefix on its CPU tier beats an
// idle worker that holds nothing, unless tiers are ignored.
func TestTierAwareCost(t *testing.T) {
	prompt := toks(64, 7)
	for _, tc := range []struct {
		name    string
		weights [kvevents.NumTiers]float64
		want    string
	}{
		{"tier aware", DefaultTierWeights, "cpu-holder"},
		{"tiers ignored", [kvevents.NumTiers]float64{kvevents.TierGPU: 1}, "idle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.WorkerChain = CostWorkerChain() // Dynamo's formula, asked for
			cfg.BlockSize = 4
			cfg.TierWeights = tc.weights
			r := newRouter(t, cfg, "cpu-holder", "idle")
			blocks := make([]kvevents.Block, 16)
			for i := range blocks {
				blocks[i] = kvevents.Block{EngineHash: uint64(i + 1), TokenIDs: prompt[i*4 : (i+1)*4]}
			}
			if err := r.ApplyEvent(kvevents.RouterEvent{WorkerID: "cpu-holder", EventID: 1, Event: kvevents.Event{Stored: &kvevents.Stored{Medium: "CPU_PINNED", Blocks: blocks}}}); err != nil {
				t.Fatal(err)
			}
			// Load the CPU holder a little, so that without tier credit the
			// idle worker is cheaper.
			if _, err := r.Commit(testenv.Context(t), "busy", WorkerKey{ID: "cpu-holder"}, Request{Tokens: toks(16, 5000)}); err != nil {
				t.Fatal(err)
			}
			sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if sel.WorkerID != tc.want {
				t.Errorf("chose %s (cost %v), want %s", sel.WorkerID, sel.Cost, tc.want)
			}
		})
	}
}

// TestConfigGuard: a worker whose stores are all skipped (the wrong block
// size at the index, or a relay's notice for SGLang's page_size 1) gets a
// warning naming the flag to fix, until its blocks are indexed.
func TestConfigGuard(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "mismatch", "paged", "fine")
	if err := r.ApplyEvent(stored("mismatch", nil, blk(1, 1, 8))); err == nil {
		t.Fatal("a block of 8 tokens in a pool of 4 was accepted")
	}
	notice := kvevents.SkipNotice{Reason: string(kvevents.SkipBlockSize), Events: 12, EngineBlockSize: 1, BlockSize: 4}
	if err := r.ApplyEvent(kvevents.RouterEvent{WorkerID: "paged", EventID: 1, Event: kvevents.Event{Skipped: &notice}}); err != nil {
		t.Fatal(err)
	}
	if err := r.ApplyEvent(stored("fine", nil, blk(1, 1, 4))); err != nil {
		t.Fatal(err)
	}
	for w, want := range map[string][]string{
		"mismatch": {"blocks of 8 tokens", "--block-size 4", "--page-size 4", "--router-block-size"},
		"paged":    {"blocks of 1 tokens", "--page-size 4", "SGLang's default"},
		"fine":     nil,
	} {
		got := r.ConfigWarning(WorkerKey{ID: w})
		if want == nil && got != "" {
			t.Errorf("%s: warning %q, want none", w, got)
		}
		for _, s := range want {
			if !strings.Contains(got, s) {
				t.Errorf("%s: warning %q does not say %q", w, got, s)
			}
		}
	}
	// Once the worker's blocks are indexed the warning goes.
	if err := r.ApplyEvent(stored("paged", nil, blk(2, 2, 4))); err != nil {
		t.Fatal(err)
	}
	if got := r.ConfigWarning(WorkerKey{ID: "paged"}); got != "" {
		t.Errorf("after an indexed store: warning %q, want none", got)
	}
}
