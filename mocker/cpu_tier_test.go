package mocker

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
)

// TestCPUTierOffloadAndReload: a prefix evicted from a small GPU cache is
// offloaded to the CPU tier (Stored medium CPU, Removed from the GPU), and
// a later request with that prefix reloads it instead of recomputing it:
// its first token comes sooner than without the tier. The events keep a
// router's per-tier index in step with the engine.
func TestCPUTierOffloadAndReload(t *testing.T) {
	ttft := map[int]time.Duration{}
	for _, cpu := range []int{0, 64} {
		eng, err := NewEngine(Config{BlockSize: 16, NumBlocks: 80, CPUBlocks: cpu})
		if err != nil {
			t.Fatal(err)
		}
		ix, _ := localrouter.NewIndex(16, localrouter.IndexOptions{})
		var id uint64
		apply := func(evs []kvevents.Event) {
			for _, ev := range evs {
				id++
				if err := ix.Apply(kvevents.RouterEvent{WorkerID: "w", EventID: id, Event: ev}); err != nil {
					t.Fatalf("cpu %d: router refused %+v: %v", cpu, ev, err)
				}
			}
		}
		drive := func(now time.Time, r Request) Completion {
			t.Helper()
			if err := eng.Submit(now, r); err != nil {
				t.Fatal(err)
			}
			res := eng.Step(now)
			var done Completion
			for {
				apply(res.Events)
				for _, c := range res.Completed {
					done = c
				}
				if res.Next.IsZero() {
					return done
				}
				res = eng.Step(res.Next)
			}
		}
		a := prompt(1, 1024) // 64 blocks
		now := t0
		drive(now, Request{ID: "a", Tokens: a, MaxTokens: 1})
		// Another long prompt evicts a's blocks from the GPU.
		now = now.Add(time.Second)
		drive(now, Request{ID: "b", Tokens: prompt(2, 1024), MaxTokens: 1})
		if cpu > 0 {
			st := eng.Stats()
			if st.OffloadedBlocks == 0 || st.CPUBlocks == 0 {
				t.Fatalf("stats %+v: nothing offloaded", st)
			}
			q, _ := kvevents.LocalHashes(a, 16, "")
			var m localrouter.Matches
			ix.FindMatches(q, &m)
			tm, ok := m.TiersOf(localrouter.WorkerKey{ID: "w"})
			if !ok || tm.Blocks[kvevents.TierCPU] == 0 {
				t.Fatalf("router sees no CPU blocks of a: %+v", tm)
			}
		}
		now = now.Add(time.Second)
		c := drive(now, Request{ID: "a2", Tokens: a, MaxTokens: 1})
		ttft[cpu] = c.FirstToken.Sub(c.Arrival)
		if cpu > 0 {
			if c.CachedTokens == 0 || eng.Stats().CPUHitTokens == 0 {
				t.Errorf("a's prefix was not reloaded from the CPU tier: cached %d, stats %+v", c.CachedTokens, eng.Stats())
			}
		}
	}
	if ttft[64] >= ttft[0] {
		t.Errorf("TTFT with a CPU tier %v, without %v: a reload must beat a recompute", ttft[64], ttft[0])
	}
}
