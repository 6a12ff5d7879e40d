package localrouter

// The Index's prefix tree holds no Go pointers. With ≈1M (block, worker)
// entries it is hundreds of thousands of nodes, and as heap objects linked
// by pointers (parent, first child, a map of the other children, a slice
// of overflow worker words) the GC walked every one of them at every
// cycle, which is where the routing path's tail latency went during a
// mark. Here the nodes live in fixed-size chunks of a slab and name each
// other by id, the other children are in one open-addressing table keyed
// by (parent id, local hash), and overflow worker words are in one arena
// of words (bitset.go): a chunk, the table and the arena are pointer-free
// allocations that the GC does not scan, so the whole tree costs it one
// pointer per chunk. (The tokenizer's tables did the same move,
// tokenizer/table.go.)

// nodeID names a node of the tree: its place in the Index's node slab.
// Id 0 is the root. The root is nobody's child and no entry's node, so
// where an id names a child (node.c1, the child table), a worker's block
// (slotState.engine) or an entry's node (listEntry.n), 0 means "none".
type nodeID uint32

const rootID nodeID = 0

// node is one block in the prefix tree. Its identity is its path of local
// hashes from the root; children are found by local hash. Most nodes have
// a single child, kept inline (c1); the others are in the Index's child
// table.
type node struct {
	local   uint64
	c1Hash  uint64
	workers workerSet
	parent  nodeID
	c1      nodeID // 0: none
	more    uint32 // children in the child table
	// lists: for each entry list of the index (listKind), the slab index
	// of the node's first entry there, 0 for none (entrylist.go).
	lists [numLists]int32
}

func (n *node) leaf() bool { return n.c1 == 0 && n.more == 0 }

const (
	nodeChunkBits = 12
	nodeChunk     = 1 << nodeChunkBits // nodes per chunk of the slab
)

// nodeSlab holds the nodes in chunks that never move, so growth copies no
// node and a *node stays valid while its node lives. Freed nodes are
// chained through their parent field and reused first; chunks are never
// given back (the slab stays sized for the peak, as the maps of the
// per-worker state do). Not safe for concurrent use: the Index's mu
// guards it (at only reads).
type nodeSlab struct {
	chunks []*[nodeChunk]node
	used   nodeID // ids handed out, freed ones included
	free   nodeID // first freed id, 0: none (the root is never freed)
}

// newNodeSlab returns a slab holding the root (id 0).
func newNodeSlab() nodeSlab {
	var s nodeSlab
	s.alloc()
	return s
}

func (s *nodeSlab) at(id nodeID) *node {
	return &s.chunks[id>>nodeChunkBits][id&(nodeChunk-1)]
}

// alloc returns the id of a zeroed node.
func (s *nodeSlab) alloc() nodeID {
	if id := s.free; id != 0 {
		n := s.at(id)
		s.free = n.parent
		*n = node{}
		return id
	}
	id := s.used
	if id == ^nodeID(0) {
		panic("localrouter: more than 2^32-1 index nodes")
	}
	if int(id>>nodeChunkBits) == len(s.chunks) {
		s.chunks = append(s.chunks, new([nodeChunk]node))
	}
	s.used++
	return id
}

// release frees node id for reuse. Nothing may name it any more.
func (s *nodeSlab) release(id nodeID) {
	*s.at(id) = node{parent: s.free}
	s.free = id
}

// childTable maps (parent id, local hash) to the child's id, for every
// child but each node's inline one: open addressing with linear probing
// over a power-of-two number of slots, at most half full (a quarter after
// it grows or shrinks), and backward-shift deletion, so that a removal
// leaves no tombstone and a lookup's probe run ends at the first free
// slot. Not safe for concurrent use: the Index's mu guards it (get only
// reads).
type childTable struct {
	slots []childSlot // len is 0 or a power of two
	n     int
}

type childSlot struct {
	hash   uint64
	parent nodeID
	child  nodeID // 0: free
}

const minChildSlots = 16

// home is the first slot to probe for (parent, h): the splitmix64
// finalizer over both, so that small or structured hashes (tests, the
// children of one parent) spread over the table as well as random ones.
func (t *childTable) home(parent nodeID, h uint64) uint64 {
	z := h + uint64(parent)*0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return (z ^ z>>31) & uint64(len(t.slots)-1)
}

// get returns the child of parent with local hash h, 0 if none.
func (t *childTable) get(parent nodeID, h uint64) nodeID {
	if t.n == 0 {
		return 0
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(parent, h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.child == 0 {
			return 0
		}
		if s.hash == h && s.parent == parent {
			return s.child
		}
	}
}

// put maps (parent, h) to child (not 0). The key must be absent.
func (t *childTable) put(parent nodeID, h uint64, child nodeID) {
	if 2*(t.n+1) > len(t.slots) {
		t.resize(max(minChildSlots, 2*len(t.slots)))
	}
	t.insert(childSlot{hash: h, parent: parent, child: child})
	t.n++
}

func (t *childTable) insert(s childSlot) {
	mask := uint64(len(t.slots) - 1)
	i := t.home(s.parent, s.hash)
	for t.slots[i].child != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = s
}

// del removes (parent, h) and reports whether it was there.
func (t *childTable) del(parent nodeID, h uint64) bool {
	if t.n == 0 {
		return false
	}
	mask := uint64(len(t.slots) - 1)
	i := t.home(parent, h)
	for {
		s := &t.slots[i]
		if s.child == 0 {
			return false
		}
		if s.hash == h && s.parent == parent {
			break
		}
		i = (i + 1) & mask
	}
	// Backward shift: move back into the hole each later slot of the run
	// whose home is not after the hole, so that every key stays reachable
	// from its home without crossing a free slot.
	for j := i; ; {
		j = (j + 1) & mask
		s := &t.slots[j]
		if s.child == 0 {
			break
		}
		if k := t.home(s.parent, s.hash); (j-k)&mask >= (j-i)&mask {
			t.slots[i] = *s
			i = j
		}
	}
	t.slots[i] = childSlot{}
	t.n--
	if len(t.slots) > minChildSlots && 8*t.n < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
	return true
}

// resize rehashes the table into size slots (a power of two, more than
// twice the keys).
func (t *childTable) resize(size int) {
	old := t.slots
	t.slots = make([]childSlot, size)
	for _, s := range old {
		if s.child != 0 {
			t.insert(s)
		}
	}
}

// child returns the child of node p (n = the node itself) with local hash
// h, 0 if none. Caller holds mu.
func (ix *Index) child(p nodeID, n *node, h uint64) nodeID {
	if n.c1Hash == h && n.c1 != 0 {
		return n.c1
	}
	return ix.otherChild(p, n, h)
}

// otherChild is child past the inline one (apart so that child inlines
// into the walks).
//
//go:noinline
func (ix *Index) otherChild(p nodeID, n *node, h uint64) nodeID {
	if n.more != 0 {
		return ix.kids.get(p, h)
	}
	return 0
}

// childOf is child for a parent given by id alone.
func (ix *Index) childOf(p nodeID, h uint64) nodeID { return ix.child(p, ix.tree.at(p), h) }

// addChild adds a child of p with local hash h, which p must not have, and
// returns its id. Caller holds mu for writing.
func (ix *Index) addChild(p nodeID, h uint64) nodeID {
	c := ix.tree.alloc()
	cn := ix.tree.at(c)
	cn.local, cn.parent = h, p
	n := ix.tree.at(p)
	if n.c1 == 0 {
		n.c1Hash, n.c1 = h, c
		return c
	}
	ix.kids.put(p, h, c)
	n.more++
	return c
}

// removeChild unlinks child c from its parent p. Caller holds mu for
// writing.
func (ix *Index) removeChild(p, c nodeID) {
	n := ix.tree.at(p)
	if n.c1 == c {
		n.c1, n.c1Hash = 0, 0
		return
	}
	if ix.kids.del(p, ix.tree.at(c).local) {
		n.more--
	}
}

// freeNode returns node id, unlinked from its parent and held by no
// worker, to the slab. Entries still naming it (an approximate-mode or
// predicted entry whose hold another entry of the same worker released
// first) are detached: they stay in their lists until they go as usual,
// and releasing them then is a no-op, as it was for a pruned node before
// ids. Caller holds mu for writing.
func (ix *Index) freeNode(id nodeID) {
	n := ix.tree.at(id)
	ix.approx.detach(n)
	ix.pred.list.detach(n)
	ix.tree.release(id)
}
