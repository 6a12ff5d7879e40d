package localrouter

import (
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvgate/kvgate/kvevents"
)

func u64(v uint64) *uint64 { return &v }

// blk returns a block of bs tokens all equal to v.
func blk(eh uint64, v uint32, bs int) kvevents.Block {
	t := make([]uint32, bs)
	for i := range t {
		t[i] = v
	}
	return kvevents.Block{EngineHash: eh, TokenIDs: t}
}

func stored(w string, parent *uint64, blocks ...kvevents.Block) kvevents.RouterEvent {
	return kvevents.RouterEvent{WorkerID: w, Event: kvevents.Event{Stored: &kvevents.Stored{ParentHash: parent, Blocks: blocks}}}
}

func removed(w string, ehs ...uint64) kvevents.RouterEvent {
	return kvevents.RouterEvent{WorkerID: w, Event: kvevents.Event{Removed: &kvevents.Removed{EngineHashes: ehs}}}
}

// hashesOf returns the local hashes of blocks whose tokens are all v[i].
func hashesOf(bs int, vs ...uint32) []uint64 {
	out := make([]uint64, len(vs))
	for i, v := range vs {
		out[i] = kvevents.BlockHash(blk(0, v, bs).TokenIDs, kvevents.Seed)
	}
	return out
}

func overlaps(ix *Index, q []uint64) map[string]int {
	var m Matches
	ix.FindMatches(q, &m)
	out := map[string]int{}
	for _, o := range m.Overlaps {
		out[o.Worker.String()] = o.Blocks
	}
	return out
}

func TestIndexApplyAndFind(t *testing.T) {
	const bs = 4
	tests := []struct {
		name   string
		events []kvevents.RouterEvent
		query  []uint32
		want   map[string]int
		errs   int
	}{
		{
			name:   "chain on one worker",
			events: []kvevents.RouterEvent{stored("a", nil, blk(1, 10, bs), blk(2, 11, bs), blk(3, 12, bs))},
			query:  []uint32{10, 11, 12, 13},
			want:   map[string]int{"a/0": 3},
		},
		{
			name: "two workers share a prefix",
			events: []kvevents.RouterEvent{
				stored("a", nil, blk(1, 10, bs), blk(2, 11, bs), blk(3, 12, bs)),
				stored("b", nil, blk(7, 10, bs)),
				stored("b", u64(7), blk(8, 11, bs)),
			},
			query: []uint32{10, 11, 12},
			want:  map[string]int{"a/0": 3, "b/0": 2},
		},
		{
			name: "removed middle block stops the match",
			events: []kvevents.RouterEvent{
				stored("a", nil, blk(1, 10, bs), blk(2, 11, bs), blk(3, 12, bs)),
				removed("a", 2),
			},
			query: []uint32{10, 11, 12},
			want:  map[string]int{"a/0": 1},
		},
		{
			name: "unknown parent rejected whole",
			events: []kvevents.RouterEvent{
				stored("a", nil, blk(1, 10, bs)),
				stored("a", u64(99), blk(2, 11, bs)),
			},
			query: []uint32{10, 11},
			want:  map[string]int{"a/0": 1},
			errs:  1,
		},
		{
			name: "partial block rejected whole",
			events: []kvevents.RouterEvent{
				stored("a", nil, blk(1, 10, bs), kvevents.Block{EngineHash: 2, TokenIDs: []uint32{1, 2}}),
			},
			query: []uint32{10},
			want:  map[string]int{},
			errs:  1,
		},
		{
			name: "duplicate store is idempotent",
			events: []kvevents.RouterEvent{
				stored("a", nil, blk(1, 10, bs)),
				stored("a", nil, blk(1, 10, bs)),
				removed("a", 1),
			},
			query: []uint32{10},
			want:  map[string]int{},
		},
		{
			name: "cleared drops the worker only",
			events: []kvevents.RouterEvent{
				stored("a", nil, blk(1, 10, bs)),
				stored("b", nil, blk(1, 10, bs)),
				{WorkerID: "a", Event: kvevents.Event{Cleared: true}},
			},
			query: []uint32{10},
			want:  map[string]int{"b/0": 1},
		},
		{
			name:   "no match exits early",
			events: []kvevents.RouterEvent{stored("a", nil, blk(1, 10, bs))},
			query:  []uint32{11, 10},
			want:   map[string]int{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix, err := NewIndex(bs, IndexOptions{})
			if err != nil {
				t.Fatal(err)
			}
			errs := 0
			for _, ev := range tt.events {
				if ix.Apply(ev) != nil {
					errs++
				}
			}
			if errs != tt.errs {
				t.Errorf("got %d rejected events, want %d", errs, tt.errs)
			}
			if got := ix.Stats().EventsRejected; got != uint64(tt.errs) {
				t.Errorf("EventsRejected = %d, want %d", got, tt.errs)
			}
			if diff := cmp.Diff(tt.want, overlaps(ix, hashesOf(bs, tt.query...))); diff != "" {
				t.Errorf("overlaps (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIndexRejectsWithSentinels(t *testing.T) {
	ix, _ := NewIndex(4, IndexOptions{})
	if err := ix.Apply(stored("a", u64(5), blk(1, 1, 4))); !errors.Is(err, ErrUnknownParent) {
		t.Errorf("unknown parent: got %v, want ErrUnknownParent", err)
	}
	if err := ix.Apply(stored("a", nil, blk(1, 1, 3))); !errors.Is(err, ErrBlockSizeMismatch) {
		t.Errorf("short block: got %v, want ErrBlockSizeMismatch", err)
	}
	if err := ix.Apply(kvevents.RouterEvent{WorkerID: "a"}); !errors.Is(err, kvevents.ErrInvalidEvent) {
		t.Errorf("empty event: got %v, want ErrInvalidEvent", err)
	}
	ix.Apply(removed("a", 1, 2))
	if got := ix.Stats().RemovedUnknown; got != 2 {
		t.Errorf("RemovedUnknown = %d, want 2", got)
	}
	if _, err := NewIndex(0, IndexOptions{}); !errors.Is(err, kvevents.ErrBlockSize) {
		t.Errorf("NewIndex(0): got %v, want ErrBlockSize", err)
	}
	if st := ix.Stats(); st.Nodes != 0 || st.Entries != 0 {
		t.Errorf("index not empty after rejected events: %+v", st)
	}
}

func TestIndexRemoveWorkerAndTreeSize(t *testing.T) {
	ix, _ := NewIndex(2, IndexOptions{})
	ix.Apply(stored("a", nil, blk(1, 1, 2), blk(2, 2, 2)))
	ix.Apply(kvevents.RouterEvent{WorkerID: "a", DPRank: 1, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: []kvevents.Block{blk(1, 1, 2)}}}})
	ix.Apply(stored("b", nil, blk(1, 1, 2)))
	if got := ix.TreeSize(WorkerKey{ID: "a", DPRank: 0}); got != 2 {
		t.Errorf("TreeSize(a/0) = %d, want 2", got)
	}
	ix.RemoveWorker("a")
	if diff := cmp.Diff(map[string]int{"b/0": 1}, overlaps(ix, hashesOf(2, 1, 2))); diff != "" {
		t.Errorf("after RemoveWorker (-want +got):\n%s", diff)
	}
	if st := ix.Stats(); st.Nodes != 1 || st.Entries != 1 {
		t.Errorf("stats after RemoveWorker = %+v, want 1 node, 1 entry", st)
	}
}

// childrenOf returns the children of node n: its inline one, then those in
// the child table. Caller holds mu.
func (ix *Index) childrenOf(n nodeID) []nodeID {
	var out []nodeID
	if c := ix.tree.at(n).c1; c != 0 {
		out = append(out, c)
	}
	for _, s := range ix.kids.slots {
		if s.child != 0 && s.parent == n {
			out = append(out, s.child)
		}
	}
	return out
}

// snapshot is a canonical picture of an index: per worker, the set of paths
// (sequence hashes) it holds.
func snapshot(ix *Index) map[string][]uint64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[string][]uint64{}
	var walk func(n nodeID, path uint64, depth int)
	walk = func(n nodeID, path uint64, depth int) {
		for _, c := range ix.childrenOf(n) {
			cn := ix.tree.at(c)
			p := cn.local
			if depth > 0 {
				p = kvevents.ChainHash(path, cn.local)
			}
			for s := range ix.slots {
				if ix.slots[s].live && cn.workers.has(int32(s), &ix.wx) {
					k := ix.slots[s].key.String()
					out[k] = append(out[k], p)
				}
			}
			walk(c, p, depth+1)
		}
	}
	walk(rootID, 0, 0)
	for k := range out {
		sort.Slice(out[k], func(i, j int) bool { return out[k][i] < out[k][j] })
	}
	return out
}

func TestDumpRoundTrip(t *testing.T) {
	ix, _ := NewIndex(2, IndexOptions{})
	ix.Apply(stored("a", nil, blk(1, 1, 2), blk(2, 2, 2), blk(3, 3, 2)))
	ix.Apply(stored("a", u64(1), blk(4, 4, 2)))
	ix.Apply(stored("b", nil, blk(1, 1, 2), blk(2, 2, 2)))
	ix.Apply(removed("b", 1)) // b keeps a block whose parent it lost
	ix.Apply(stored("a", nil, blk(9, 1, 2)))
	ix.Record(time.Now(), WorkerKey{ID: "c", DPRank: 0}, hashesOf(2, 5, 6))

	dump := ix.Dump()
	re, _ := NewIndex(2, IndexOptions{})
	for _, ev := range dump {
		if err := re.Apply(ev); err != nil {
			t.Fatalf("applying dump event %+v: %v", ev, err)
		}
	}
	if diff := cmp.Diff(snapshot(ix), snapshot(re)); diff != "" {
		t.Errorf("rebuilt index differs (-want +got):\n%s", diff)
	}
	for _, q := range [][]uint32{{1, 2, 3}, {1, 4}, {2}, {5, 6}} {
		if diff := cmp.Diff(overlaps(ix, hashesOf(2, q...)), overlaps(re, hashesOf(2, q...))); diff != "" {
			t.Errorf("query %v differs (-want +got):\n%s", q, diff)
		}
	}
	// JSON and msgpack carry the dump too.
	for _, ev := range dump {
		b, err := kvevents.EncodeJSON(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kvevents.DecodeJSON(b); err != nil {
			t.Fatalf("dump event does not decode: %v (%s)", err, b)
		}
	}
}

func TestApproximateTTLAndBound(t *testing.T) {
	ix, _ := NewIndex(2, IndexOptions{TTL: time.Minute, MaxApproxEntries: 10})
	t0 := time.Unix(1000, 0)
	ix.Record(t0, WorkerKey{ID: "a", DPRank: 0}, hashesOf(2, 1, 2, 3))
	ix.Record(t0.Add(30*time.Second), WorkerKey{ID: "b", DPRank: 0}, hashesOf(2, 1, 2))
	if diff := cmp.Diff(map[string]int{"a/0": 3, "b/0": 2}, overlaps(ix, hashesOf(2, 1, 2, 3))); diff != "" {
		t.Errorf("before expiry (-want +got):\n%s", diff)
	}
	// Reuse refreshes a's first block only.
	ix.Record(t0.Add(50*time.Second), WorkerKey{ID: "a", DPRank: 0}, hashesOf(2, 1))
	ix.Expire(t0.Add(61 * time.Second))
	if diff := cmp.Diff(map[string]int{"a/0": 1, "b/0": 2}, overlaps(ix, hashesOf(2, 1, 2, 3))); diff != "" {
		t.Errorf("after a's entries expired (-want +got):\n%s", diff)
	}
	ix.Expire(t0.Add(200 * time.Second))
	if st := ix.Stats(); st.Entries != 0 || st.Nodes != 0 {
		t.Errorf("after all expired: %+v", st)
	}
	// Size bound: 12 entries > 10 → pruned to 8, oldest first.
	for i := 0; i < 12; i++ {
		ix.Record(t0.Add(300*time.Second), WorkerKey{ID: fmt.Sprintf("w%d", i), DPRank: 0}, hashesOf(2, uint32(100+i)))
	}
	st := ix.Stats()
	if st.Entries > 10 || st.ApproxEntriesPrune == 0 {
		t.Errorf("bound not enforced: %+v", st)
	}
	if got := overlaps(ix, hashesOf(2, 100)); len(got) != 0 {
		t.Errorf("oldest entry survived pruning: %v", got)
	}
	if got := overlaps(ix, hashesOf(2, 111)); got["w11/0"] != 1 {
		t.Errorf("newest entry pruned: %v", got)
	}
}

// model is the simple map-based picture FuzzApply checks the index against.
type model struct {
	engine map[string]map[uint64]uint64 // worker → engine hash → path
	chains map[uint64][]uint64          // path → local hashes from the root
}

func (m *model) holds(w string, path uint64) bool {
	for _, p := range m.engine[w] {
		if p == path {
			return true
		}
	}
	return false
}

func (m *model) apply(ev kvevents.RouterEvent, bs int) error {
	w := ev.WorkerID
	switch {
	case ev.Event.Stored != nil:
		st := ev.Event.Stored
		for _, b := range st.Blocks {
			if len(b.TokenIDs) != bs {
				return errors.New("size")
			}
		}
		var parentChain []uint64
		if st.ParentHash != nil {
			p, ok := m.engine[w][*st.ParentHash]
			if !ok {
				return errors.New("parent")
			}
			parentChain = m.chains[p]
		}
		if m.engine[w] == nil {
			m.engine[w] = map[uint64]uint64{}
		}
		chain := append([]uint64(nil), parentChain...)
		for _, b := range st.Blocks {
			chain = append(chain, kvevents.BlockHash(b.TokenIDs, kvevents.Seed))
			seq := kvevents.SequenceHashes(chain)
			path := seq[len(seq)-1]
			m.chains[path] = append([]uint64(nil), chain...)
			m.engine[w][b.EngineHash] = path
		}
	case ev.Event.Removed != nil:
		for _, eh := range ev.Event.Removed.EngineHashes {
			delete(m.engine[w], eh)
		}
	case ev.Event.Cleared:
		delete(m.engine, w)
	}
	return nil
}

func (m *model) overlaps(q []uint64) map[string]int {
	out := map[string]int{}
	seq := kvevents.SequenceHashes(q)
	for w := range m.engine {
		n := 0
		for n < len(seq) && m.holds(w, seq[n]) {
			n++
		}
		if n > 0 {
			out[w+"/0"] = n
		}
	}
	return out
}

func (m *model) size(w string) int {
	set := map[uint64]bool{}
	for _, p := range m.engine[w] {
		set[p] = true
	}
	return len(set)
}

func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 0, 0, 1, 1, 9, 2, 3})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 2, 4, 1, 0, 0, 0, 3, 0})
	f.Add([]byte{0, 0, 3, 1, 2, 3, 0, 1, 3, 1, 1, 2, 1, 1, 0, 2})
	const bs = 2
	workers := []string{"a", "b", "c"}
	f.Fuzz(func(t *testing.T, data []byte) {
		ix, _ := NewIndex(bs, IndexOptions{})
		m := &model{engine: map[string]map[uint64]uint64{}, chains: map[uint64][]uint64{}}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		for step := 0; len(data) > 0 && step < 64; step++ {
			op := next() % 5
			w := workers[next()%3]
			var ev kvevents.RouterEvent
			switch op {
			case 0, 1: // stored
				var parent *uint64
				if p := next() % 6; p < 5 {
					parent = u64(uint64(p))
				}
				n := int(next()%3) + 1
				var blocks []kvevents.Block
				for i := 0; i < n; i++ {
					b := blk(uint64(next()%6), uint32(next()%3), bs)
					if next()%16 == 0 {
						b.TokenIDs = b.TokenIDs[:1] // partial block
					}
					blocks = append(blocks, b)
				}
				ev = stored(w, parent, blocks...)
			case 2:
				ev = removed(w, uint64(next()%6), uint64(next()%6))
			case 3:
				ev = kvevents.RouterEvent{WorkerID: w, Event: kvevents.Event{Cleared: true}}
			case 4:
				ix.RemoveWorker(w)
				delete(m.engine, w)
				continue
			}
			// The model cannot express one engine hash stored twice within a
			// single event at two positions; the index handles it, skip it.
			if ev.Event.Stored != nil {
				seen := map[uint64]bool{}
				dup := false
				for _, b := range ev.Event.Stored.Blocks {
					dup = dup || seen[b.EngineHash]
					seen[b.EngineHash] = true
				}
				if dup {
					continue
				}
			}
			if testing.Verbose() {
				t.Logf("step %d op %d: %s", step, op, mustJSON(ev))
			}
			merr := m.apply(ev, bs)
			ierr := ix.Apply(ev)
			if (merr == nil) != (ierr == nil) {
				t.Fatalf("step %d %+v: model error %v, index error %v", step, ev.Event, merr, ierr)
			}
			for _, w := range workers {
				if got, want := ix.TreeSize(WorkerKey{ID: w, DPRank: 0}), m.size(w); got != want {
					t.Fatalf("step %d: tree size of %s = %d, want %d", step, w, got, want)
				}
			}
			for _, chain := range m.chains {
				q := append(append([]uint64(nil), chain...), 12345)
				if diff := cmp.Diff(m.overlaps(q), overlaps(ix, q)); diff != "" {
					t.Fatalf("step %d: overlaps of %v (-model +index):\n%s", step, chain, diff)
				}
			}
		}
	})
}

func mustJSON(ev kvevents.RouterEvent) string {
	b, _ := kvevents.EncodeJSON(ev)
	return string(b)
}
