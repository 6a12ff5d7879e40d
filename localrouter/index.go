package localrouter

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/kvgate/kvgate/kvevents"
)

// WorkerKey names one data-parallel rank of one worker: the unit the index
// and the cost function reason about.
type WorkerKey struct {
	ID     string
	DPRank uint32
}

func (k WorkerKey) String() string { return fmt.Sprintf("%s/%d", k.ID, k.DPRank) }

// Errors of Index.Apply. Each is counted in IndexStats as well.
var (
	// ErrUnknownParent: a Stored event names a parent block the worker does
	// not hold. The event is rejected whole.
	ErrUnknownParent = errors.New("stored event's parent block is unknown for this worker")
	// ErrBlockSizeMismatch: a Stored block's token count differs from the
	// index's block size. The event is rejected whole.
	ErrBlockSizeMismatch = errors.New("stored block has the wrong number of tokens")
)

// node is one block in the prefix tree. Its identity is its path of local
// hashes from the root; children are found by local hash. Most nodes have a
// single child, kept inline; the rest go to a map.
type node struct {
	local   uint64
	parent  *node
	c1Hash  uint64
	c1      *node
	more    map[uint64]*node
	workers workerSet
}

func (n *node) child(h uint64) *node {
	if n.c1 != nil && n.c1Hash == h {
		return n.c1
	}
	if n.more != nil {
		return n.more[h]
	}
	return nil
}

func (n *node) addChild(h uint64) *node {
	c := &node{local: h, parent: n}
	if n.c1 == nil {
		n.c1Hash, n.c1 = h, c
		return c
	}
	if n.more == nil {
		n.more = make(map[uint64]*node, 2)
	}
	n.more[h] = c
	return c
}

func (n *node) removeChild(c *node) {
	if n.c1 == c {
		n.c1, n.c1Hash = nil, 0
		return
	}
	delete(n.more, c.local)
	if len(n.more) == 0 {
		n.more = nil
	}
}

func (n *node) leaf() bool { return n.c1 == nil && len(n.more) == 0 }

// slotState is what the index keeps per (worker, dp_rank).
type slotState struct {
	key  WorkerKey
	live bool
	// engine maps the engine's block hashes to nodes (event mode).
	engine map[uint64]*node
	// aliases counts extra engine hashes mapped to an already-held node (an
	// engine storing the same content twice under two hashes): the node is
	// dropped only when its last mapping goes.
	aliases map[*node]int
	// size is the number of nodes this worker holds.
	size int
}

// approxKey identifies a (worker slot, node) pair in approximate mode.
type approxKey struct {
	slot int32
	n    *node
}

// IndexStats are the index's counters since it was made.
type IndexStats struct {
	EventsApplied      uint64
	EventsRejected     uint64 // unknown parent, block size mismatch, invalid
	RemovedUnknown     uint64 // engine hashes in Removed events the worker did not hold
	BlocksStored       uint64
	Entries            int // (block, worker) pairs held
	Nodes              int // distinct blocks in the tree
	ApproxEntriesPrune uint64
}

// Index is a prefix index of the KV blocks each worker holds.
//
// Concurrency: an Index is safe for concurrent use. Reads (FindMatches,
// TreeSize) take a read lock and run in parallel with each other; writes
// (Apply, Record, RemoveWorker, Expire) take the write lock and are applied
// one at a time. A reader sees every write that finished before it started
// and none that started after it. No other lock is taken while it is held.
type Index struct {
	blockSize int

	mu      sync.RWMutex
	root    node
	slots   []slotState
	table   slotTable
	nodes   int
	entries int

	// approximate mode: LRU of (slot, node) with expiry times, oldest first.
	approx    *simplelru.LRU[approxKey, time.Time]
	ttl       time.Duration
	maxApprox int

	applied, rejected, removedUnknown, stored, pruned atomic.Uint64
}

// IndexOptions configures an Index. Zero values take the defaults.
type IndexOptions struct {
	// TTL of approximate-mode entries (default 120 s), refreshed on reuse.
	TTL time.Duration
	// MaxApproxEntries bounds approximate-mode entries (default 2^20); past
	// it the oldest are pruned down to 80 %.
	MaxApproxEntries int
}

// NewIndex returns an empty index for blocks of blockSize tokens.
func NewIndex(blockSize int, opts IndexOptions) (*Index, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: got %d", kvevents.ErrBlockSize, blockSize)
	}
	if opts.TTL <= 0 {
		opts.TTL = 120 * time.Second
	}
	if opts.MaxApproxEntries <= 0 {
		opts.MaxApproxEntries = 1 << 20
	}
	ix := &Index{
		blockSize: blockSize,
		table:     newSlotTable(),
		ttl:       opts.TTL,
		maxApprox: opts.MaxApproxEntries,
	}
	ix.approx, _ = simplelru.NewLRU[approxKey, time.Time](opts.MaxApproxEntries+1, ix.onApproxEvict)
	return ix, nil
}

// BlockSize is the number of tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

// slotFor returns the slot of key, creating it. Caller holds mu for writing.
func (ix *Index) slotFor(key WorkerKey) int32 {
	s, fresh := ix.table.acquire(key)
	if fresh {
		ix.slots = grow(ix.slots, s)
		ix.slots[s] = slotState{key: key, live: true, engine: make(map[uint64]*node)}
	}
	return s
}

// hold marks n as held by slot. Caller holds mu.
func (ix *Index) hold(n *node, slot int32) bool {
	if n.workers.add(slot) {
		ix.slots[slot].size++
		ix.entries++
		return true
	}
	return false
}

// release drops slot from n and prunes empty leaves upward. Caller holds mu.
func (ix *Index) release(n *node, slot int32) {
	if !n.workers.remove(slot) {
		return
	}
	ix.slots[slot].size--
	ix.entries--
	ix.prune(n)
}

func (ix *Index) prune(n *node) {
	for n != &ix.root && n.workers.empty() && n.leaf() {
		p := n.parent
		p.removeChild(n)
		n.parent = nil
		ix.nodes--
		n = p
	}
}

// Apply applies one event. A rejected event changes nothing; the error says
// why. Removals of engine hashes the worker does not hold are skipped and
// counted, not errors.
func (ix *Index) Apply(ev kvevents.RouterEvent) error {
	if err := ev.Validate(); err != nil {
		ix.rejected.Add(1)
		return err
	}
	key := WorkerKey{ev.WorkerID, ev.DPRank}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var err error
	switch {
	case ev.Event.Stored != nil:
		err = ix.applyStored(key, ev.Event.Stored)
	case ev.Event.Removed != nil:
		ix.applyRemoved(key, ev.Event.Removed)
	case ev.Event.Cleared:
		if s, ok := ix.table.lookup(key); ok {
			ix.clearSlot(s)
		}
	}
	if err != nil {
		ix.rejected.Add(1)
		return fmt.Errorf("event %d of worker %s: %w", ev.EventID, key, err)
	}
	ix.applied.Add(1)
	return nil
}

func (ix *Index) applyStored(key WorkerKey, st *kvevents.Stored) error {
	// Check everything before touching the tree: never half-applied.
	seed := kvevents.LoRASeed(st.LoRAName)
	for i, b := range st.Blocks {
		if len(b.TokenIDs) > 0 && len(b.TokenIDs) != ix.blockSize {
			return fmt.Errorf("%w: block %d has %d tokens, block size is %d", ErrBlockSizeMismatch, i, len(b.TokenIDs), ix.blockSize)
		}
	}
	slot, known := ix.table.lookup(key)
	parent := &ix.root
	if st.ParentHash != nil {
		var p *node
		if known {
			p = ix.slots[slot].engine[*st.ParentHash]
		}
		if p == nil {
			return fmt.Errorf("%w: parent engine hash %d", ErrUnknownParent, *st.ParentHash)
		}
		parent = p
	}
	if !known {
		slot = ix.slotFor(key)
	}
	ss := &ix.slots[slot]
	for _, b := range st.Blocks {
		var h uint64
		if len(b.TokenIDs) > 0 {
			h = kvevents.BlockHash(b.TokenIDs, seed)
		} else {
			h = *b.LocalHash
		}
		c := parent.child(h)
		if c == nil {
			c = parent.addChild(h)
			ix.nodes++
		}
		old, remap := ss.engine[b.EngineHash]
		if remap && old == c {
			parent = c // a duplicate store
			continue
		}
		ss.engine[b.EngineHash] = c
		if !ix.hold(c, slot) {
			if ss.aliases == nil {
				ss.aliases = make(map[*node]int)
			}
			ss.aliases[c]++
		}
		if remap {
			// The engine reused a hash for other content: drop the old
			// mapping. c is held now, so pruning stops at it or below.
			ix.drop(slot, old)
		}
		ix.stored.Add(1)
		parent = c
	}
	return nil
}

// unmap removes one engine-hash mapping of slot. Caller holds mu.
func (ix *Index) unmap(slot int32, eh uint64, n *node) {
	delete(ix.slots[slot].engine, eh)
	ix.drop(slot, n)
}

// drop releases one mapping of slot to n: an alias if there is one, else
// the node itself. Caller holds mu.
func (ix *Index) drop(slot int32, n *node) {
	ss := &ix.slots[slot]
	if a := ss.aliases[n]; a > 0 {
		if a == 1 {
			delete(ss.aliases, n)
		} else {
			ss.aliases[n] = a - 1
		}
		return
	}
	ix.release(n, slot)
}

func (ix *Index) applyRemoved(key WorkerKey, rm *kvevents.Removed) {
	slot, ok := ix.table.lookup(key)
	if !ok {
		ix.removedUnknown.Add(uint64(len(rm.EngineHashes)))
		return
	}
	for _, eh := range rm.EngineHashes {
		n, ok := ix.slots[slot].engine[eh]
		if !ok {
			ix.removedUnknown.Add(1)
			continue
		}
		ix.unmap(slot, eh, n)
	}
}

// clearSlot drops every block of slot, keeping the slot. Caller holds mu.
func (ix *Index) clearSlot(slot int32) {
	ss := &ix.slots[slot]
	for _, n := range ss.engine {
		ix.release(n, slot)
	}
	ss.engine = make(map[uint64]*node)
	ss.aliases = nil
	if ss.size > 0 { // approximate-mode entries
		for _, k := range ix.approx.Keys() {
			if k.slot == slot {
				ix.approx.Remove(k)
			}
		}
	}
}

// RemoveWorker drops everything the worker (all its dp ranks) holds.
func (ix *Index) RemoveWorker(id string) { ix.RemoveRanks(id, 0) }

// RemoveRanks drops everything worker id's ranks from fromRank up hold
// (a worker whose dp_size shrank).
func (ix *Index) RemoveRanks(id string, fromRank uint32) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for key, slot := range ix.table.byKey {
		if key.ID != id || key.DPRank < fromRank {
			continue
		}
		ix.clearSlot(slot)
		ix.slots[slot] = slotState{}
		ix.table.release(key)
	}
}

// Overlap is one worker's match for a request.
type Overlap struct {
	Worker WorkerKey
	// Blocks is the number of leading request blocks the worker holds.
	Blocks int
	// TreeSize is the number of blocks the worker holds in all.
	TreeSize int
}

// Matches is FindMatches' result. Reuse one across calls to avoid
// allocations; it is not safe for concurrent use.
type Matches struct {
	Overlaps []Overlap
	scratch  words
	slots    []int32 // index slot of each Overlaps entry
	pos      []int32 // index slot → 1 + position in Overlaps (0: none)
}

// ofSlot returns the overlap of the worker at index slot, checking that the
// slot still belongs to key (a slot can be reused after a removal).
func (m *Matches) ofSlot(slot int32, key WorkerKey) int {
	if slot < 0 || int(slot) >= len(m.pos) {
		return 0
	}
	p := m.pos[slot]
	if p == 0 || m.Overlaps[p-1].Worker != key {
		return 0
	}
	return m.Overlaps[p-1].Blocks
}

// Of returns the overlap of worker key, 0 if it matched nothing.
func (m *Matches) Of(key WorkerKey) int {
	for _, o := range m.Overlaps {
		if o.Worker == key {
			return o.Blocks
		}
	}
	return 0
}

// FindMatches fills m with, for each worker holding at least the first
// block, the number of leading blocks of localHashes it holds and its tree
// size. It stops as soon as no worker matches.
func (ix *Index) FindMatches(localHashes []uint64, m *Matches) {
	for _, s := range m.slots {
		m.pos[s] = 0
	}
	m.Overlaps, m.slots = m.Overlaps[:0], m.slots[:0]
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := &ix.root
	depth := 0
	for i, h := range localHashes {
		c := n.child(h)
		if c == nil {
			break
		}
		if i == 0 {
			m.scratch = m.scratch.load(&c.workers)
			if c.workers.empty() {
				return
			}
		} else if !m.scratch.intersect(&c.workers, func(slot int32) { m.add(ix, slot, i) }) {
			return
		}
		n = c
		depth = i + 1
	}
	if depth == 0 {
		return
	}
	for i, x := range m.scratch {
		for x != 0 {
			b := trailingZeros(x)
			x &= x - 1
			m.add(ix, int32(i*64+b), depth)
		}
	}
}

func (m *Matches) add(ix *Index, slot int32, blocks int) {
	ss := &ix.slots[slot]
	m.Overlaps = append(m.Overlaps, Overlap{Worker: ss.key, Blocks: blocks, TreeSize: ss.size})
	m.slots = append(m.slots, slot)
	for int(slot) >= len(m.pos) {
		m.pos = append(m.pos, 0)
	}
	m.pos[slot] = int32(len(m.Overlaps))
}

// ensureSlot returns key's slot, creating it, so that callers can cache it
// (see Matches.ofSlot).
func (ix *Index) ensureSlot(key WorkerKey) int32 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.slotFor(key)
}

// TreeSize returns the number of blocks worker key holds.
func (ix *Index) TreeSize(key WorkerKey) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if s, ok := ix.table.lookup(key); ok {
		return ix.slots[s].size
	}
	return 0
}

// Stats returns the index's counters.
func (ix *Index) Stats() IndexStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return IndexStats{
		EventsApplied:      ix.applied.Load(),
		EventsRejected:     ix.rejected.Load(),
		RemovedUnknown:     ix.removedUnknown.Load(),
		BlocksStored:       ix.stored.Load(),
		Entries:            ix.entries,
		Nodes:              ix.nodes,
		ApproxEntriesPrune: ix.pruned.Load(),
	}
}

// Record inserts, in approximate mode, the blocks of a request routed to
// key: each (block, worker) entry lives for the TTL after its last Record.
// When entries exceed the bound, the oldest are pruned down to 80 %.
func (ix *Index) Record(now time.Time, key WorkerKey, localHashes []uint64) {
	if len(localHashes) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	slot := ix.slotFor(key)
	n := &ix.root
	exp := now.Add(ix.ttl)
	for _, h := range localHashes {
		c := n.child(h)
		if c == nil {
			c = n.addChild(h)
			ix.nodes++
		}
		ix.hold(c, slot)
		ix.approx.Add(approxKey{slot, c}, exp)
		n = c
	}
	if ix.approx.Len() > ix.maxApprox {
		target := ix.maxApprox * 8 / 10
		for ix.approx.Len() > target {
			ix.approx.RemoveOldest()
			ix.pruned.Add(1)
		}
	}
	ix.expireLocked(now)
}

// Expire drops approximate-mode entries whose TTL passed.
func (ix *Index) Expire(now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.expireLocked(now)
}

func (ix *Index) expireLocked(now time.Time) {
	for {
		_, exp, ok := ix.approx.GetOldest()
		if !ok || exp.After(now) {
			return
		}
		ix.approx.RemoveOldest()
	}
}

// onApproxEvict runs under mu (simplelru calls it synchronously).
func (ix *Index) onApproxEvict(k approxKey, _ time.Time) {
	// A node can be pruned while still in the LRU only if the worker was
	// removed; then its slot no longer holds it and release is a no-op.
	if k.n.parent == nil && k.n != &ix.root {
		return
	}
	ix.release(k.n, k.slot)
}

// Dump returns the index as events that rebuild it when applied, in order,
// to an empty index of the same block size. Blocks carry local hashes, not
// token ids. A worker holding a block whose parent it does not hold is
// rebuilt with stand-in parents that are stored and then removed.
// Approximate-mode entries are dumped as stored blocks without TTL.
func (ix *Index) Dump() []kvevents.RouterEvent {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []kvevents.RouterEvent
	keys := make([]WorkerKey, 0, len(ix.table.byKey))
	for k := range ix.table.byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].ID != keys[j].ID {
			return keys[i].ID < keys[j].ID
		}
		return keys[i].DPRank < keys[j].DPRank
	})
	for _, key := range keys {
		out = ix.dumpSlot(out, ix.table.byKey[key])
	}
	return out
}

func depthOf(n *node) int {
	d := 0
	for ; n.parent != nil; n = n.parent {
		d++
	}
	return d
}

func (ix *Index) dumpSlot(out []kvevents.RouterEvent, slot int32) []kvevents.RouterEvent {
	ss := &ix.slots[slot]
	type mapping struct {
		eh    uint64
		n     *node
		depth int
	}
	var ms []mapping
	for eh, n := range ss.engine {
		ms = append(ms, mapping{eh, n, depthOf(n)})
	}
	// Approximate-mode entries have no engine hash: give them stand-ins.
	used := make(map[uint64]bool, len(ss.engine))
	for eh := range ss.engine {
		used[eh] = true
	}
	next := uint64(1) << 63
	fresh := func() uint64 {
		for used[next] {
			next++
		}
		used[next] = true
		return next
	}
	if len(ss.engine) == 0 && ss.size > 0 {
		for _, k := range ix.approx.Keys() {
			if k.slot == slot {
				ms = append(ms, mapping{fresh(), k.n, depthOf(k.n)})
			}
		}
	}
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].depth != ms[j].depth {
			return ms[i].depth < ms[j].depth
		}
		return ms[i].eh < ms[j].eh
	})
	primary := make(map[*node]uint64, len(ms)) // node → an engine hash of it
	standIn := make(map[*node]uint64)
	var standIns []uint64
	var eventID uint64
	emit := func(parent *uint64, blocks []kvevents.Block) {
		eventID++
		out = append(out, kvevents.RouterEvent{WorkerID: ss.key.ID, DPRank: ss.key.DPRank, EventID: eventID,
			Event: kvevents.Event{Stored: &kvevents.Stored{ParentHash: parent, Blocks: blocks}}})
	}
	// parentRef returns the engine hash to store n's children under,
	// creating stand-ins for ancestors the worker does not hold.
	var parentRef func(n *node) *uint64
	parentRef = func(n *node) *uint64 {
		if n == &ix.root {
			return nil
		}
		if eh, ok := primary[n]; ok {
			return &eh
		}
		if eh, ok := standIn[n]; ok {
			return &eh
		}
		pp := parentRef(n.parent)
		eh := fresh()
		standIn[n] = eh
		standIns = append(standIns, eh)
		h := n.local
		emit(pp, []kvevents.Block{{EngineHash: eh, LocalHash: &h}})
		return &eh
	}
	for _, m := range ms {
		p := parentRef(m.n.parent)
		h := m.n.local
		emit(p, []kvevents.Block{{EngineHash: m.eh, LocalHash: &h}})
		if _, ok := primary[m.n]; !ok {
			primary[m.n] = m.eh
		}
	}
	if len(standIns) > 0 {
		eventID++
		out = append(out, kvevents.RouterEvent{WorkerID: ss.key.ID, DPRank: ss.key.DPRank, EventID: eventID,
			Event: kvevents.Event{Removed: &kvevents.Removed{EngineHashes: standIns}}})
	}
	return out
}
