package localrouter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// linearPrefix is the obvious one-lookup-per-block version of activePrefix.
func linearPrefix(a *ActiveSequences, seq []uint64) map[WorkerKey]int {
	out := map[WorkerKey]int{}
	for key, slot := range a.table.byKey {
		n := 0
		for n < len(seq) {
			found := false
			for _, r := range a.blocks[seq[n]] {
				found = found || r.slot == slot
			}
			if !found {
				break
			}
			n++
		}
		if n > 0 {
			out[key] = n
		}
	}
	return out
}

// TestActivePrefixMatchesLinear checks the bisection against the linear
// walk on random request trees over several workers.
func TestActivePrefixMatchesLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	for round := 0; round < 200; round++ {
		a := NewActiveSequences()
		// Requests are prefixes of a few base chains with random tails, so
		// workers share prefixes of different lengths.
		bases := make([][]uint64, 3)
		for i := range bases {
			bases[i] = make([]uint64, 40)
			for j := range bases[i] {
				bases[i][j] = rng.Uint64()
			}
		}
		for r := 0; r < 1+rng.IntN(12); r++ {
			base := bases[rng.IntN(len(bases))]
			seq := append([]uint64(nil), base[:rng.IntN(len(base)+1)]...)
			for k := rng.IntN(4); k > 0; k-- {
				seq = append(seq, rng.Uint64())
			}
			w := WorkerKey{ID: fmt.Sprint("w", rng.IntN(5)), DPRank: 0}
			a.Add(time.Now(), fmt.Sprint("r", r), w, seq, len(seq)*16, 0, 16)
		}
		q := bases[rng.IntN(len(bases))][:1+rng.IntN(40)]
		a.mu.Lock()
		a.activePrefix(q)
		got := map[WorkerKey]int{}
		for key, slot := range a.table.byKey {
			if v := a.prefix[slot]; v > 0 {
				got[key] = int(v)
			}
		}
		want := linearPrefix(a, q)
		a.mu.Unlock()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("round %d: bisection %v, linear %v", round, got, want)
		}
	}
}
