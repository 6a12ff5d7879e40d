package localrouter

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvgate/kvgate/kvevents"
)

// checkTree checks the tree's invariants: every child table entry and
// inline child names a live node whose parent and local hash it has, each
// node's count of table children is right, the nodes reached from the
// root are Stats().Nodes and the rest of the slab is in the free list,
// no node reached is an empty leaf, and each slot's size is the number of
// nodes holding it.
func checkTree(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	more := map[nodeID]uint32{}
	kids := map[nodeID][]nodeID{}
	for _, s := range ix.kids.slots {
		if s.child == 0 {
			continue
		}
		more[s.parent]++
		kids[s.parent] = append(kids[s.parent], s.child)
		if c := ix.tree.at(s.child); c.parent != s.parent || c.local != s.hash {
			t.Fatalf("table maps (%d, %#x) to %d, whose parent is %d and hash %#x", s.parent, s.hash, s.child, c.parent, c.local)
		}
	}
	if n := len(ix.kids.slots); n != 0 && (2*ix.kids.n > n || n&(n-1) != 0) {
		t.Fatalf("child table: %d keys in %d slots", ix.kids.n, n)
	}
	sizes := make([]int, len(ix.slots))
	seen := map[nodeID]bool{rootID: true}
	stack := []nodeID{rootID}
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := ix.tree.at(id)
		if n.more != more[id] {
			t.Fatalf("node %d counts %d table children, the table has %d", id, n.more, more[id])
		}
		if n.c1 != 0 {
			if c := ix.tree.at(n.c1); c.parent != id || c.local != n.c1Hash {
				t.Fatalf("node %d's inline child %d has parent %d, hash %#x (want %#x)", id, n.c1, c.parent, c.local, n.c1Hash)
			}
		}
		if id != rootID && n.workers.empty() && n.leaf() {
			t.Fatalf("node %d is an empty leaf", id)
		}
		for s := range ix.slots {
			if n.workers.has(int32(s), &ix.wx) {
				sizes[s]++
			}
		}
		cs := kids[id]
		if n.c1 != 0 {
			cs = append(cs, n.c1)
		}
		for _, c := range cs {
			if seen[c] {
				t.Fatalf("node %d reached twice", c)
			}
			seen[c] = true
			stack = append(stack, c)
		}
	}
	if len(seen)-1 != ix.nodes {
		t.Fatalf("%d nodes reached, Stats says %d", len(seen)-1, ix.nodes)
	}
	free := 0
	for id := ix.tree.free; id != 0; id = ix.tree.at(id).parent {
		if seen[id] {
			t.Fatalf("live node %d in the free list", id)
		}
		free++
	}
	if int(ix.tree.used)-1-free != ix.nodes {
		t.Fatalf("slab: %d ids, %d free, %d nodes", ix.tree.used, free, ix.nodes)
	}
	for s := range ix.slots {
		if ix.slots[s].live && sizes[s] != ix.slots[s].size {
			t.Fatalf("slot %d (%s) held by %d nodes, size %d", s, ix.slots[s].key, sizes[s], ix.slots[s].size)
		}
	}
}

// hasPointers reports whether a value of type t holds a pointer the GC
// would follow.
func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
		return false
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Pointer, reflect.UnsafePointer, reflect.Map, reflect.Slice, reflect.String, reflect.Interface, reflect.Chan, reflect.Func:
		return true
	}
	return false
}

// TestTreeHoldsNoPointers: the types the tree is made of hold no pointers,
// so that the GC scans none of the index's chunks, tables and lists, and
// the per-worker maps to nodes have pointer-free keys and values (Go does
// not scan those either).
func TestTreeHoldsNoPointers(t *testing.T) {
	for _, v := range []any{node{}, [nodeChunk]node{}, childSlot{}, listEntry{}, workerSet{}, nodeID(0)} {
		if typ := reflect.TypeOf(v); hasPointers(typ) {
			t.Errorf("%v holds pointers", typ)
		}
	}
	ss := reflect.TypeOf(slotState{})
	for _, f := range []string{"engine", "aliases"} {
		m, _ := ss.FieldByName(f)
		if hasPointers(m.Type.Key()) || hasPointers(m.Type.Elem()) {
			t.Errorf("slotState.%s (%v) has pointerful keys or values", f, m.Type)
		}
	}
	for _, v := range []any{struct{ p *int }{}, [2]struct{ s []int }{}, struct{ m map[int]int }{}, struct{ s string }{}} {
		if !hasPointers(reflect.TypeOf(v)) {
			t.Fatalf("hasPointers misses the pointer of %T", v)
		}
	}
}

// FuzzChildTable: any sequence of puts, gets and deletes answers as a map.
// Each op is 3 bytes: the op, a parent and a hash drawn from small ranges,
// so that keys collide, share parents and hashes, and probe runs wrap;
// the table grows and shrinks on the way.
func FuzzChildTable(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 1, 3, 2, 1, 2, 1, 1, 3})
	f.Add(make([]byte, 300))
	seq := make([]byte, 0, 3*400)
	for i := range 300 {
		seq = append(seq, 0, byte(i%7), byte(i))
	}
	for i := range 100 {
		seq = append(seq, 2, byte(i%7), byte(3*i))
	}
	f.Add(seq)
	f.Fuzz(func(t *testing.T, data []byte) {
		type key struct {
			p nodeID
			h uint64
		}
		var tab childTable
		model := map[key]nodeID{}
		next := nodeID(1)
		for len(data) >= 3 {
			op, p, hb := data[0]%3, nodeID(data[1]%8), data[2]
			data = data[3:]
			h := uint64(hb)
			if hb&0x80 != 0 { // some hashes far apart, some adjacent
				h = uint64(hb) * 0x9E3779B97F4A7C15
			}
			k := key{p, h}
			switch op {
			case 0:
				if _, ok := model[k]; !ok {
					tab.put(p, h, next)
					model[k] = next
					next++
				}
			case 1:
				if got, want := tab.get(p, h), model[k]; got != want {
					t.Fatalf("get(%d, %#x) = %d, want %d", p, h, got, want)
				}
			case 2:
				_, want := model[k]
				if got := tab.del(p, h); got != want {
					t.Fatalf("del(%d, %#x) = %v, want %v", p, h, got, want)
				}
				delete(model, k)
			}
			if tab.n != len(model) {
				t.Fatalf("%d keys, want %d", tab.n, len(model))
			}
			for k, want := range model {
				if got := tab.get(k.p, k.h); got != want {
					t.Fatalf("after op %d: get(%d, %#x) = %d, want %d", op, k.p, k.h, got, want)
				}
			}
		}
	})
}

// TestWorkerSetOverflow: slots past 64 go to the arena and come back from
// it, and blocks freed by one set are reused by another.
func TestWorkerSetOverflow(t *testing.T) {
	var a wordArena
	var s, u workerSet
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[int32]bool{}
	for range 5000 {
		slot := int32(rng.IntN(700))
		if rng.IntN(2) == 0 {
			if got := s.add(slot, &a); got == want[slot] {
				t.Fatalf("add(%d) = %v with the slot held: %v", slot, got, want[slot])
			}
			want[slot] = true
		} else {
			if got := s.remove(slot, &a); got != want[slot] {
				t.Fatalf("remove(%d) = %v, held %v", slot, got, want[slot])
			}
			delete(want, slot)
		}
		u.add(int32(64+rng.IntN(200)), &a)
		if rng.IntN(8) == 0 {
			for i := int32(64); i < 264; i++ {
				u.remove(i, &a)
			}
			if !u.empty() || u.xo != 0 {
				t.Fatalf("emptied set %+v", u)
			}
		}
		for i := int32(0); i < 700; i++ {
			if s.has(i, &a) != want[i] {
				t.Fatalf("has(%d) = %v, want %v", i, !want[i], want[i])
			}
		}
		var w words
		w = w.load(&s, &a)
		n := 0
		for _, x := range w {
			for ; x != 0; x &= x - 1 {
				n++
			}
		}
		if n != len(want) || s.empty() != (len(want) == 0) {
			t.Fatalf("set of %d slots loads %d, empty %v", len(want), n, s.empty())
		}
	}
	if len(a.w) > 64*40 {
		t.Errorf("arena grew to %d words: blocks not reused", len(a.w))
	}
}

// diffModel extends the test model (index_test.go) with the number of
// nodes the index must keep: every prefix of a held chain.
func (m *model) nodes() int {
	seen := map[uint64]bool{}
	for _, held := range m.engine {
		for _, p := range held {
			seq := kvevents.SequenceHashes(m.chains[p])
			for _, s := range seq {
				seen[s] = true
			}
		}
	}
	return len(seen)
}

// TestIndexDifferentialDeep: random stored / removed / cleared events and
// worker removals, for more than 64 workers (so worker sets overflow),
// with chains up to 12 blocks deep over a small alphabet (so that nodes
// fan out and children at depth are removed and re-added), checked after
// every step against the model: per-worker overlaps and tree sizes, the
// node count, and the tree's invariants.
func TestIndexDifferentialDeep(t *testing.T) {
	const bs = 2
	seeds := 3
	steps := 500
	if testing.Short() {
		seeds, steps = 2, 200
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 99))
			workers := make([]string, 70)
			for i := range workers {
				workers[i] = fmt.Sprintf("w%02d", i)
			}
			ix, _ := NewIndex(bs, IndexOptions{})
			m := &model{engine: map[string]map[uint64]uint64{}, chains: map[uint64][]uint64{}}
			var queries [][]uint64
			for step := range steps {
				w := workers[rng.IntN(len(workers))]
				if rng.IntN(4) == 0 {
					w = workers[60+rng.IntN(10)] // slots past 64 get busy
				}
				op := rng.IntN(20)
				if step < len(workers) { // first, every worker gets a slot, 70 in all
					w, op = workers[step], 0
				}
				held := m.engine[w]
				var ev kvevents.RouterEvent
				switch {
				case op < 11: // a chain, from the root or from a held block
					var parent *uint64
					if len(held) > 0 && rng.IntN(3) > 0 {
						ehs := make([]uint64, 0, len(held))
						for eh := range held {
							ehs = append(ehs, eh)
						}
						sort.Slice(ehs, func(i, j int) bool { return ehs[i] < ehs[j] })
						parent = u64(ehs[rng.IntN(len(ehs))])
					}
					var blocks []kvevents.Block
					used := map[uint64]bool{}
					for range 1 + rng.IntN(6) {
						eh := uint64(rng.IntN(40))
						if used[eh] {
							continue
						}
						used[eh] = true
						blocks = append(blocks, blk(eh, uint32(rng.IntN(3)), bs))
					}
					ev = stored(w, parent, blocks...)
				case op < 17:
					var ehs []uint64
					for range 1 + rng.IntN(4) {
						ehs = append(ehs, uint64(rng.IntN(40)))
					}
					ev = removed(w, ehs...)
				case op < 19:
					ev = kvevents.RouterEvent{WorkerID: w, Event: kvevents.Event{Cleared: true}}
				default:
					ix.RemoveWorker(w)
					delete(m.engine, w)
				}
				if ev.WorkerID != "" {
					merr := m.apply(ev, bs)
					ierr := ix.Apply(ev)
					if (merr == nil) != (ierr == nil) {
						t.Fatalf("step %d %s: model error %v, index error %v", step, mustJSON(ev), merr, ierr)
					}
				}
				checkTree(t, ix)
				if got, want := ix.Stats().Nodes, m.nodes(); got != want {
					t.Fatalf("step %d: %d nodes, want %d", step, got, want)
				}
				for _, w := range workers {
					if got, want := ix.TreeSize(WorkerKey{ID: w, DPRank: 0}), m.size(w); got != want {
						t.Fatalf("step %d: tree size of %s = %d, want %d", step, w, got, want)
					}
				}
				// Queries: the chains of 16 held blocks, and 8 other chains
				// ever stored, each with a block past its end.
				queries = queries[:0]
				for _, held := range m.engine {
					for _, p := range held {
						if len(queries) < 16 {
							queries = append(queries, append(append([]uint64(nil), m.chains[p]...), 12345))
						}
					}
				}
				for _, chain := range m.chains {
					if len(queries) >= 24 {
						break
					}
					queries = append(queries, append(append([]uint64(nil), chain...), 12345))
				}
				for _, q := range queries {
					if want, got := m.overlaps(q), overlaps(ix, q); !maps.Equal(want, got) {
						t.Fatalf("step %d: overlaps of %v (-model +index):\n%s", step, q, cmp.Diff(want, got))
					}
				}
			}
			maxDepth := 0
			for _, chain := range m.chains {
				maxDepth = max(maxDepth, len(chain))
			}
			t.Logf("%d chains stored, %d blocks deep at most; %d nodes, %d in the child table, %d arena words at the end",
				len(m.chains), maxDepth, ix.Stats().Nodes, ix.kids.n, len(ix.wx.w))
			for _, w := range workers {
				ix.RemoveWorker(w)
			}
			checkTree(t, ix)
			if st := ix.Stats(); st.Nodes != 0 || st.Entries != 0 || ix.kids.n != 0 {
				t.Fatalf("emptied index: %+v, %d table children", st, ix.kids.n)
			}
		})
	}
}

// TestDetachedEntriesStayHarmless: a predicted entry whose node is freed
// (its hold released by an approximate-mode entry of the same worker
// expiring: Predict and Record on one index) is detached; when it goes, it
// releases nothing, even though the freed node's id was reused meanwhile
// for a block the worker holds from an event.
func TestDetachedEntriesStayHarmless(t *testing.T) {
	ix, _ := NewIndex(2, IndexOptions{TTL: time.Second, PredictedTTL: 10 * time.Second})
	key := WorkerKey{ID: "a", DPRank: 0}
	t0 := time.Unix(1000, 0)
	q := hashesOf(2, 8)
	ix.Predict(t0, key, q)
	ix.Record(t0, key, q)              // the same hold, a second entry
	ix.Expire(t0.Add(2 * time.Second)) // the approximate entry expires, freeing the node
	checkTree(t, ix)
	if st := ix.Stats(); st.Nodes != 0 || ix.PredictedStats().Entries != 1 {
		t.Fatalf("after the approximate entry expired: %+v, %+v; want no node, one (detached) prediction", st, ix.PredictedStats())
	}
	mustApply(t, ix, stored("a", nil, blk(1, 9, 2))) // reuses the freed id
	ix.Expire(t0.Add(11 * time.Second))              // the detached prediction goes
	checkTree(t, ix)
	if got := overlaps(ix, hashesOf(2, 9)); got["a/0"] != 1 {
		t.Fatalf("the block on the reused id was released: %v", got)
	}
	if st := ix.PredictedStats(); st.Entries != 0 || st.Expired != 1 {
		t.Fatalf("predicted stats %+v, want none left, one expired", st)
	}
}

// TestDumpSkipsDetachedEntries: an approximate-mode entry whose node went
// (its worker's predicted entry on the same node expired first, releasing
// the shared hold) holds nothing; Dump leaves it out and rebuilds the rest.
func TestDumpSkipsDetachedEntries(t *testing.T) {
	ix, _ := NewIndex(2, IndexOptions{TTL: time.Minute, PredictedTTL: time.Second})
	key := WorkerKey{ID: "a", DPRank: 0}
	t0 := time.Unix(1000, 0)
	ix.Predict(t0, key, hashesOf(2, 8))
	ix.Record(t0, key, hashesOf(2, 8)) // the same hold, a second entry
	ix.Record(t0, key, hashesOf(2, 9))
	ix.Expire(t0.Add(2 * time.Second)) // the prediction expires, freeing node 8
	if got := overlaps(ix, hashesOf(2, 8)); len(got) != 0 {
		t.Fatalf("block 8 still held: %v", got)
	}
	re, _ := NewIndex(2, IndexOptions{})
	for _, ev := range ix.Dump() {
		if err := re.Apply(ev); err != nil {
			t.Fatalf("applying dump event %+v: %v", ev, err)
		}
	}
	if got := overlaps(re, hashesOf(2, 9)); got["a/0"] != 1 || len(overlaps(re, hashesOf(2, 8))) != 0 {
		t.Fatalf("rebuilt index: block 9 %v, block 8 %v; want only block 9", got, overlaps(re, hashesOf(2, 8)))
	}
}
