package localrouter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestActiveRefsRecycled: with requests added and freed at random over
// workers sharing prefixes, every block's refs count its requests on each
// worker, each worker's active blocks are their number, and no one-ref
// slice is both in use and spare, or spare twice.
func TestActiveRefsRecycled(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := NewActiveSequences()
	base := make([]uint64, 30)
	for i := range base {
		base[i] = rng.Uint64()
	}
	live := map[string]struct {
		key WorkerKey
		seq []uint64
	}{}
	now := time.Unix(100, 0)
	for op := 0; op < 800; op++ {
		if len(live) > 0 && rng.IntN(2) == 0 {
			for id := range live { // any one
				a.Free(id)
				delete(live, id)
				break
			}
		} else {
			seq := append([]uint64(nil), base[:rng.IntN(len(base)+1)]...)
			for k := rng.IntN(3); k > 0; k-- {
				seq = append(seq, rng.Uint64())
			}
			id, key := fmt.Sprint("r", op), WorkerKey{ID: fmt.Sprint("w", rng.IntN(3)), DPRank: 0}
			if err := a.Add(now, id, key, seq, len(seq)*16, 0, 16); err != nil {
				t.Fatal(err)
			}
			live[id] = struct {
				key WorkerKey
				seq []uint64
			}{key, seq}
		}
		// Recount every block's refs from the live requests.
		want := map[uint64]map[WorkerKey]int32{}
		for _, r := range live {
			for _, h := range r.seq {
				if want[h] == nil {
					want[h] = map[WorkerKey]int32{}
				}
				want[h][r.key]++
			}
		}
		got := map[uint64]map[WorkerKey]int32{}
		inUse := map[*blockRef]bool{}
		for h, refs := range a.blocks {
			got[h] = map[WorkerKey]int32{}
			for _, r := range refs {
				got[h][a.slots[r.slot].key] = r.n
			}
			inUse[&refs[0]] = true
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("op %d: refs (-want +got):\n%s", op, diff)
		}
		for w := range 3 {
			key, n := WorkerKey{ID: fmt.Sprint("w", w), DPRank: 0}, 0
			for _, ws := range want {
				if ws[key] > 0 {
					n++
				}
			}
			if got := a.Load(key).ActiveBlocks; got != n {
				t.Fatalf("op %d: active blocks of %s: got %d, want %d", op, key, got, n)
			}
		}
		spare := map[*blockRef]bool{}
		for _, s := range a.spare {
			if cap(s) != 1 || inUse[&s[0]] || spare[&s[0]] {
				t.Fatalf("op %d: spare slice of cap %d, in use %v, spare twice %v", op, cap(s), inUse[&s[0]], spare[&s[0]])
			}
			spare[&s[0]] = true
		}
	}
}
