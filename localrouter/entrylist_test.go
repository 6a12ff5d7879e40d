package localrouter

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// order returns the list's entries oldest first, as "node/slot" (the
// test's nodes are named a, b, … by their local hash 0, 1, …).
func order(l *entryList) []string {
	var out []string
	l.each(func(_, slot int32, n nodeID) { out = append(out, fmt.Sprintf("%c/%d", 'a'+l.tree.at(n).local, slot)) })
	return out
}

func TestEntryList(t *testing.T) {
	tree := newNodeSlab()
	l := newEntryList(predList, &tree)
	x, y := tree.alloc(), tree.alloc()
	tree.at(x).local, tree.at(y).local = 0, 1
	t0 := time.Unix(100, 0)
	ix0 := l.push(0, x, t0.Add(1*time.Second))
	l.push(1, x, t0.Add(2*time.Second)) // a second entry on the same node
	iy := l.push(0, y, t0.Add(3*time.Second))
	if diff := cmp.Diff([]string{"a/0", "a/1", "b/0"}, order(&l)); diff != "" {
		t.Fatalf("after pushes (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		slot int32
		n    nodeID
		want int32
	}{{0, x, ix0}, {0, y, iy}, {1, y, 0}, {2, x, 0}} {
		if got := l.find(c.slot, c.n); got != c.want {
			t.Errorf("find(%d, %c): got %d, want %d", c.slot, 'a'+tree.at(c.n).local, got, c.want)
		}
	}
	// A touch makes the entry the newest, with its new expiry.
	l.touch(ix0, t0.Add(4*time.Second))
	if diff := cmp.Diff([]string{"a/1", "b/0", "a/0"}, order(&l)); diff != "" {
		t.Fatalf("after touch (-want +got):\n%s", diff)
	}
	if l.expired(ix0, t0.Add(3*time.Second)) || !l.expired(ix0, t0.Add(4*time.Second)) {
		t.Fatalf("touched entry: expired before 4 s or live at 4 s")
	}
	// Removing the node's first entry keeps its other one findable.
	if slot, n := l.remove(ix0); slot != 0 || n != x {
		t.Fatalf("remove: got slot %d node %c, want 0 a", slot, 'a'+tree.at(n).local)
	}
	if l.find(0, x) != 0 || l.find(1, x) == 0 {
		t.Fatalf("after removing x's slot 0 entry: find(0, x) = %d, find(1, x) = %d, want 0 and an entry", l.find(0, x), l.find(1, x))
	}
	if diff := cmp.Diff([]string{"a/1", "b/0"}, order(&l)); diff != "" {
		t.Fatalf("after remove (-want +got):\n%s", diff)
	}
	// A freed element is reused: the slab does not grow.
	size := len(l.slab)
	if got := l.push(2, y, t0.Add(5*time.Second)); got != ix0 {
		t.Fatalf("push after remove: got index %d, want the freed %d", got, ix0)
	}
	if len(l.slab) != size || l.len != 3 {
		t.Fatalf("slab %d elements, %d entries: want %d, 3", len(l.slab), l.len, size)
	}
	for l.oldest() != 0 {
		l.remove(l.oldest())
	}
	if l.len != 0 || tree.at(x).lists[predList] != 0 || tree.at(y).lists[predList] != 0 {
		t.Fatalf("emptied: %d entries, node heads %d %d, want 0 0 0", l.len, tree.at(x).lists[predList], tree.at(y).lists[predList])
	}
}
