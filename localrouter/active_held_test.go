package localrouter

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvevents"
)

// TestAddHeldMatchesAdd: requests added with AddHeld (their blocks
// entered when read) and with Add give the same loads, potential loads
// and active prefixes after every step — overlapping requests on one and
// on several workers, a held request freed before anything read it,
// renamed, settled, freed after — and the block table ends empty.
func TestAddHeldMatchesAdd(t *testing.T) {
	eager, held := NewActiveSequences(), NewActiveSequences()
	now := time.Unix(0, 0)
	w := []WorkerKey{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	chain := func(shared, own int, tag uint64) []uint64 {
		var local []uint64
		for i := range shared {
			local = append(local, uint64(1000+i))
		}
		for i := range own {
			local = append(local, tag<<32|uint64(i))
		}
		return kvevents.SequenceHashes(local)
	}
	probe := chain(6, 3, 99)
	check := func(step string) {
		t.Helper()
		loads := func(a *ActiveSequences) map[WorkerKey]WorkerLoad {
			m := map[WorkerKey]WorkerLoad{}
			a.Loads(func(k WorkerKey, l WorkerLoad) { m[k] = l })
			return m
		}
		if e, h := loads(eager), loads(held); !maps.Equal(e, h) {
			t.Fatalf("%s: loads %v (Add) vs %v (AddHeld)", step, e, h)
		}
		if e, h := eager.PotentialLoads(nil, w, probe, 36, 4, []int{0, 0, 0}), held.PotentialLoads(nil, w, probe, 36, 4, []int{0, 0, 0}); !slices.Equal(e, h) {
			t.Fatalf("%s: potential loads %v (Add) vs %v (AddHeld)", step, e, h)
		}
		if e, h := eager.Prefixes(nil, w, probe), held.Prefixes(nil, w, probe); !slices.Equal(e, h) {
			t.Fatalf("%s: prefixes %v (Add) vs %v (AddHeld)", step, e, h)
		}
	}
	add := func(id string, k WorkerKey, seq []uint64) {
		t.Helper()
		if err := eager.Add(now, id, k, seq, len(seq)*4, 0, 4); err != nil {
			t.Fatal(err)
		}
		if err := held.AddHeld(now, id, k, seq, len(seq)*4, 0, 4); err != nil {
			t.Fatal(err)
		}
	}
	both := func(f func(a *ActiveSequences)) { f(eager); f(held) }
	// A held request freed before any read: nothing entered, nothing left.
	add("r0", w[0], chain(6, 2, 1))
	both(func(a *ActiveSequences) { a.Free("r0") })
	check("freed unread")
	for i := range 6 {
		add(fmt.Sprint("r", i+1), w[i%3], chain(6-i%3, 2+i%2, uint64(i+2)))
		if i%2 == 0 {
			check(fmt.Sprint("added ", i+1))
		}
	}
	both(func(a *ActiveSequences) { a.Free("r2") })
	check("freed r2")
	both(func(a *ActiveSequences) {
		if err := a.Rename("r3", "r3b"); err != nil {
			t.Fatal(err)
		}
	})
	held.Settle()
	check("renamed, settled")
	add("r7", w[1], chain(6, 1, 50))
	both(func(a *ActiveSequences) { a.RemoveWorker("b") })
	check("worker b removed")
	for _, id := range []string{"r1", "r3b", "r4", "r5", "r6", "r7"} {
		both(func(a *ActiveSequences) { a.Free(id) })
	}
	check("all freed")
	if len(held.blocks) != 0 || len(held.held) != 0 || len(held.byID) != 0 {
		t.Fatalf("left behind: %d blocks, %d held, %d requests", len(held.blocks), len(held.held), len(held.byID))
	}
}
