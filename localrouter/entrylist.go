package localrouter

import "time"

// listKind names one of the Index's entry lists; a node keeps the first
// of its entries in each (node.lists).
type listKind int

const (
	approxList listKind = iota // approximate mode's entries (Record)
	predList                   // event mode's predicted entries (Predict)
	numLists
)

// entryList is a set of (worker slot, node) entries that share one TTL,
// oldest first. Since the TTL is shared, expiry order is the order of last
// touch: refreshing an entry moves it to the back, and expiry and the size
// bound both drop from the front.
//
// It is a doubly linked list threaded through a slab, so that an entry
// costs no allocation of its own and no map: a node holds the index of its
// first entry of the list (node.lists[kind]), its other entries (a block
// predicted on several workers) are chained from it through sib. Freed
// elements are reused. Not safe for concurrent use: the Index's mu guards
// it (find only reads).
type entryList struct {
	kind listKind
	tree *nodeSlab // the nodes the entries name (the Index's)
	// slab[0] is the sentinel: its next is the oldest entry, its prev the
	// newest, so that index 0 also means "none".
	slab []listEntry
	free int32 // first free element (chained through next), 0: none
	len  int
	// epoch is the time expiries are counted from (set by the first push):
	// an int64 is a quarter of a time.Time, and Sub keeps the monotonic
	// clock's meaning when both times have one.
	epoch time.Time
}

type listEntry struct {
	n          nodeID // 0: detached, its node was freed (detach)
	exp        int64  // expiry, in ns after epoch
	slot       int32
	prev, next int32 // neighbours in the list (0: the sentinel)
	sib        int32 // next entry of the same node (0: none)
}

func newEntryList(kind listKind, tree *nodeSlab) entryList {
	return entryList{kind: kind, tree: tree, slab: make([]listEntry, 1)}
}

// since is now as an expiry of the list.
func (l *entryList) since(now time.Time) int64 { return int64(now.Sub(l.epoch)) }

// find returns the index of slot's entry on n, 0 if it has none.
func (l *entryList) find(slot int32, n nodeID) int32 { return l.findOn(slot, l.tree.at(n)) }

// findOn is find for the node itself.
func (l *entryList) findOn(slot int32, n *node) int32 {
	for i := n.lists[l.kind]; i != 0; i = l.slab[i].sib {
		if l.slab[i].slot == slot {
			return i
		}
	}
	return 0
}

// push adds slot's entry on n, which must have none, as the newest, and
// returns its index.
func (l *entryList) push(slot int32, id nodeID, exp time.Time) int32 {
	return l.pushOn(slot, id, l.tree.at(id), exp)
}

// pushOn is push for node id given as n too.
func (l *entryList) pushOn(slot int32, id nodeID, n *node, exp time.Time) int32 {
	if l.epoch.IsZero() {
		l.epoch = exp
	}
	i := l.free
	if i != 0 {
		l.free = l.slab[i].next
	} else {
		i = int32(len(l.slab))
		l.slab = append(l.slab, listEntry{})
	}
	l.slab[i] = listEntry{n: id, exp: l.since(exp), slot: slot, sib: n.lists[l.kind]}
	n.lists[l.kind] = i
	l.link(i)
	l.len++
	return i
}

// touch gives entry i the expiry exp and makes it the newest.
func (l *entryList) touch(i int32, exp time.Time) {
	l.slab[i].exp = l.since(exp)
	l.unlink(i)
	l.link(i)
}

// remove drops entry i and returns its slot and node (0 if detached).
func (l *entryList) remove(i int32) (int32, nodeID) {
	e := l.slab[i]
	l.unlink(i)
	if e.n != 0 {
		for p := &l.tree.at(e.n).lists[l.kind]; *p != 0; p = &l.slab[*p].sib {
			if *p == i {
				*p = e.sib
				break
			}
		}
	}
	l.slab[i] = listEntry{next: l.free}
	l.free = i
	l.len--
	return e.slot, e.n
}

// oldest returns the index of the oldest entry, 0 if the list is empty.
func (l *entryList) oldest() int32 { return l.slab[0].next }

// expired reports whether entry i's TTL has passed at now.
func (l *entryList) expired(i int32, now time.Time) bool { return l.slab[i].exp <= l.since(now) }

// each calls f for every entry, oldest first; f may remove the entry it is
// given.
func (l *entryList) each(f func(i int32, slot int32, n nodeID)) {
	for i := l.slab[0].next; i != 0; {
		next := l.slab[i].next
		f(i, l.slab[i].slot, l.slab[i].n)
		i = next
	}
}

// link makes i the newest entry.
func (l *entryList) link(i int32) {
	last := l.slab[0].prev
	l.slab[i].prev, l.slab[i].next = last, 0
	l.slab[last].next = i
	l.slab[0].prev = i
}

func (l *entryList) unlink(i int32) {
	e := &l.slab[i]
	l.slab[e.prev].next = e.next
	l.slab[e.next].prev = e.prev
}

// detach unlinks node n's entries from it, which is being freed: they
// stay in the list, naming node 0, until removed as usual.
func (l *entryList) detach(n *node) {
	for i := n.lists[l.kind]; i != 0; {
		e := &l.slab[i]
		i = e.sib
		e.n, e.sib = 0, 0
	}
	n.lists[l.kind] = 0
}
