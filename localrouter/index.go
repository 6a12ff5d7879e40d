package localrouter

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
)

// WorkerKey names one data-parallel rank of one worker: the unit the index
// and the cost function reason about (api/routing).
type WorkerKey = routing.WorkerKey

// Errors of Index.Apply. Each is counted in IndexStats as well.
var (
	// ErrUnknownParent: a Stored event names a parent block the worker does
	// not hold. The event is rejected whole.
	ErrUnknownParent = errors.New("stored event's parent block is unknown for this worker")
	// ErrBlockSizeMismatch: a Stored block's token count differs from the
	// index's block size. The event is rejected whole.
	ErrBlockSizeMismatch = routing.ErrBlockSizeMismatch
)

// slotKey names one cache tier of one (worker, dp_rank): the index keeps
// each tier of a worker in its own slot, so a node's worker set says which
// tiers hold it.
type slotKey struct {
	WorkerKey
	tier kvevents.Tier
}

// slotState is what the index keeps per (worker, dp_rank, tier).
type slotState struct {
	key  WorkerKey
	tier kvevents.Tier
	live bool
	// engine maps the engine's block hashes to nodes (event mode).
	engine map[uint64]nodeID
	// aliases counts extra engine hashes mapped to an already-held node (an
	// engine storing the same content twice under two hashes): the node is
	// dropped only when its last mapping goes.
	aliases map[nodeID]int32
	// size is the number of nodes this worker holds.
	size int
}

// IndexStats are the index's counters since it was made.
type IndexStats struct {
	EventsApplied      uint64
	EventsRejected     uint64 // unknown parent, block size mismatch, invalid
	RemovedUnknown     uint64 // engine hashes in Removed events the worker did not hold
	RefUnknown         uint64 // lower-tier blocks stored by engine hash alone that the worker held on no tier
	LowerTierBlocks    int    // (block, worker) pairs held on a tier other than the GPU
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

	mu sync.RWMutex
	// tree is the prefix tree's nodes, the root at id 0; kids the children
	// that are not their parent's inline one; wx the worker sets' overflow
	// words (tree.go, bitset.go: no Go pointers in any of them).
	tree    nodeSlab
	kids    childTable
	wx      wordArena
	slots   []slotState
	table   slotTable[slotKey]
	nodes   int
	entries int
	// tiered lists, for each worker holding blocks on a lower tier, its
	// slot per tier plus one (0: none); FindMatches walks them for the
	// per-tier overlap. Empty (the common case) costs nothing.
	tiered map[WorkerKey]*[kvevents.NumTiers]int32
	lower  int // entries on lower tiers
	// guard: per worker, what was skipped before or at the index
	// (configuration guard; see ConfigWarning).
	guard map[WorkerKey]*guardInfo

	// approximate mode: (slot, node) entries with their expiry, oldest
	// first.
	approx    entryList
	ttl       time.Duration
	maxApprox int

	// pred: event mode's predicted entries (predicted.go).
	pred predictions

	applied, rejected, removedUnknown, refUnknown, stored, pruned atomic.Uint64
}

// guardInfo is what the configuration guard knows of a worker.
type guardInfo struct {
	mismatched   uint64 // stored events rejected for their block size
	engineTokens int    // the block size they had
	notice       *kvevents.SkipNotice
	warnedAt     time.Time
}

// IndexOptions configures an Index. Zero values take the defaults.
type IndexOptions struct {
	// TTL of approximate-mode entries (default 120 s), refreshed on reuse.
	TTL time.Duration
	// MaxApproxEntries bounds approximate-mode entries (default 2^20); past
	// it the oldest are pruned down to 80 %. It bounds predicted entries
	// too.
	MaxApproxEntries int
	// PredictedTTL is the lifetime of predicted entries (Predict; default
	// 10 s).
	PredictedTTL time.Duration
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
		tree:      newNodeSlab(),
		table:     newSlotTable[slotKey](),
		ttl:       opts.TTL,
		maxApprox: opts.MaxApproxEntries,
	}
	ix.approx = newEntryList(approxList, &ix.tree)
	ix.pred.init(opts.PredictedTTL, opts.MaxApproxEntries, &ix.tree)
	return ix, nil
}

// BlockSize is the number of tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

// slotFor returns the GPU slot of key, creating it. Caller holds mu for
// writing.
func (ix *Index) slotFor(key WorkerKey) int32 { return ix.tierSlotFor(key, kvevents.TierGPU) }

// tierSlotFor returns the slot of key's tier t, creating it. Caller holds
// mu for writing.
func (ix *Index) tierSlotFor(key WorkerKey, t kvevents.Tier) int32 {
	s, fresh := ix.table.acquire(slotKey{key, t})
	if fresh {
		ix.slots = grow(ix.slots, s)
		ix.slots[s] = slotState{key: key, tier: t, live: true, engine: make(map[uint64]nodeID)}
		if t != kvevents.TierGPU {
			if ix.tiered == nil {
				ix.tiered = make(map[WorkerKey]*[kvevents.NumTiers]int32)
			}
			ts := ix.tiered[key]
			if ts == nil {
				ts = new([kvevents.NumTiers]int32)
				ix.tiered[key] = ts
			}
			ts[t] = s + 1
		}
	}
	return s
}

// lookup returns the GPU slot of key. Caller holds mu.
func (ix *Index) lookup(key WorkerKey) (int32, bool) {
	return ix.table.lookup(slotKey{key, kvevents.TierGPU})
}

// findEngine returns the node worker key holds under engine hash eh,
// looking in tier first, then in its other tiers (an engine keeps a
// block's hash when it offloads or reloads it); 0 if none. Caller holds
// mu.
func (ix *Index) findEngine(key WorkerKey, first kvevents.Tier, eh uint64) nodeID {
	if s, ok := ix.table.lookup(slotKey{key, first}); ok {
		if n := ix.slots[s].engine[eh]; n != 0 {
			return n
		}
	}
	ts := ix.tiered[key]
	for t := kvevents.Tier(0); t < kvevents.NumTiers; t++ {
		if t == first {
			continue
		}
		var s int32 = -1
		if t == kvevents.TierGPU {
			if g, ok := ix.lookup(key); ok {
				s = g
			}
		} else if ts != nil {
			s = ts[t] - 1
		}
		if s >= 0 {
			if n := ix.slots[s].engine[eh]; n != 0 {
				return n
			}
		}
	}
	return 0
}

// hold marks n as held by slot. Caller holds mu.
func (ix *Index) hold(n nodeID, slot int32) bool { return ix.holdNode(ix.tree.at(n), slot) }

// holdNode is hold for the node itself.
func (ix *Index) holdNode(n *node, slot int32) bool {
	if n.workers.add(slot, &ix.wx) {
		ix.slots[slot].size++
		ix.entries++
		if ix.slots[slot].tier != kvevents.TierGPU {
			ix.lower++
		}
		return true
	}
	return false
}

// release drops slot from n and prunes empty leaves upward. Caller holds mu.
func (ix *Index) release(n nodeID, slot int32) {
	if n == 0 || !ix.tree.at(n).workers.remove(slot, &ix.wx) {
		return
	}
	ix.slots[slot].size--
	ix.entries--
	if ix.slots[slot].tier != kvevents.TierGPU {
		ix.lower--
	}
	ix.prune(n)
}

// prune frees n and its ancestors up from it while they are empty leaves.
// Caller holds mu for writing.
func (ix *Index) prune(id nodeID) {
	for id != rootID {
		n := ix.tree.at(id)
		if !n.workers.empty() || !n.leaf() {
			return
		}
		p := n.parent
		ix.removeChild(p, id)
		ix.freeNode(id)
		ix.nodes--
		id = p
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
	key := WorkerKey{ID: ev.WorkerID, DPRank: ev.DPRank}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var err error
	switch {
	case ev.Event.Stored != nil:
		err = ix.applyStored(key, ev.Event.Stored)
	case ev.Event.Removed != nil:
		ix.applyRemoved(key, ev.Event.Removed)
	case ev.Event.Cleared:
		for t := kvevents.Tier(0); t < kvevents.NumTiers; t++ {
			if s, ok := ix.table.lookup(slotKey{key, t}); ok {
				ix.clearSlot(s)
			}
		}
	case ev.Event.Skipped != nil:
		g := ix.guardOf(key)
		n := *ev.Event.Skipped
		g.notice = &n
	}
	if err != nil {
		ix.rejected.Add(1)
		if errors.Is(err, ErrBlockSizeMismatch) {
			g := ix.guardOf(key)
			g.mismatched++
			for _, b := range ev.Event.Stored.Blocks {
				if len(b.TokenIDs) != ix.blockSize && len(b.TokenIDs) > 0 {
					g.engineTokens = len(b.TokenIDs)
					break
				}
			}
		}
		return fmt.Errorf("event %d of worker %s: %w", ev.EventID, key, err)
	}
	ix.applied.Add(1)
	return nil
}

func (ix *Index) applyStored(key WorkerKey, st *kvevents.Stored) error {
	// Check everything before touching the tree: never half-applied.
	seed := kvevents.ChainSeed(st.LoRAName, st.CacheSalt)
	tier, ok := kvevents.TierOf(st.Medium)
	if !ok {
		return fmt.Errorf("%w: unknown medium %q", kvevents.ErrInvalidEvent, st.Medium)
	}
	byRef := false
	for i, b := range st.Blocks {
		if len(b.TokenIDs) > 0 && len(b.TokenIDs) != ix.blockSize {
			return fmt.Errorf("%w: block %d has %d tokens, block size is %d", ErrBlockSizeMismatch, i, len(b.TokenIDs), ix.blockSize)
		}
		if len(b.TokenIDs) == 0 && b.LocalHash == nil {
			byRef = true
		}
	}
	if byRef {
		ix.storeByRef(key, tier, st)
		return nil
	}
	parent := rootID
	if st.ParentHash != nil {
		p := ix.findEngine(key, tier, *st.ParentHash)
		if p == 0 {
			return fmt.Errorf("%w: parent engine hash %d", ErrUnknownParent, *st.ParentHash)
		}
		parent = p
	}
	slot := ix.tierSlotFor(key, tier)
	ss := &ix.slots[slot]
	for _, b := range st.Blocks {
		h := b.Hash(seed)
		c := ix.childOf(parent, h)
		if c == 0 {
			c = ix.addChild(parent, h)
			ix.nodes++
		}
		old, remap := ss.engine[b.EngineHash]
		if remap && old == c {
			parent = c // a duplicate store
			continue
		}
		ss.engine[b.EngineHash] = c
		ix.confirmPredicted(slot, c)
		if !ix.hold(c, slot) {
			if ss.aliases == nil {
				ss.aliases = make(map[nodeID]int32)
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

// storeByRef applies a lower-tier Stored whose blocks carry only engine
// hashes: each names a block the worker announced on another tier, which
// now is held on tier as well. Blocks it holds nowhere are counted and
// skipped. Caller holds mu.
func (ix *Index) storeByRef(key WorkerKey, tier kvevents.Tier, st *kvevents.Stored) {
	slot := int32(-1)
	for _, b := range st.Blocks {
		n := ix.findEngine(key, tier, b.EngineHash)
		if n == 0 {
			ix.refUnknown.Add(1)
			continue
		}
		if slot < 0 {
			slot = ix.tierSlotFor(key, tier)
		}
		ss := &ix.slots[slot]
		old, remap := ss.engine[b.EngineHash]
		if remap && old == n {
			continue
		}
		ss.engine[b.EngineHash] = n
		if !ix.hold(n, slot) {
			if ss.aliases == nil {
				ss.aliases = make(map[nodeID]int32)
			}
			ss.aliases[n]++
		}
		if remap {
			ix.drop(slot, old)
		}
		ix.stored.Add(1)
	}
}

// unmap removes one engine-hash mapping of slot. Caller holds mu.
func (ix *Index) unmap(slot int32, eh uint64, n nodeID) {
	delete(ix.slots[slot].engine, eh)
	ix.drop(slot, n)
}

// drop releases one mapping of slot to n: an alias if there is one, else
// the node itself. Caller holds mu.
func (ix *Index) drop(slot int32, n nodeID) {
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
	tier, _ := kvevents.TierOf(rm.Medium)
	slot, ok := ix.table.lookup(slotKey{key, tier})
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
	ix.clearPredicted(slot)
	ss := &ix.slots[slot]
	// An aliased node is released once; its other mappings find it freed
	// (a zeroed node in the free list: nothing is allocated meanwhile), so
	// their release is a no-op, as before.
	for _, n := range ss.engine {
		ix.release(n, slot)
	}
	ss.engine = make(map[uint64]nodeID)
	ss.aliases = nil
	if ss.size > 0 { // approximate-mode entries
		ix.approx.each(func(i, s int32, _ nodeID) {
			if s == slot {
				ix.dropApprox(i)
			}
		})
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
		delete(ix.tiered, key.WorkerKey)
		delete(ix.guard, key.WorkerKey)
	}
}

// Overlap is one worker's match on one tier for a request.
type Overlap struct {
	Worker WorkerKey
	// Tier is the cache tier (kvevents.TierGPU for the engine's device
	// memory, the only one without offloading).
	Tier kvevents.Tier
	// Blocks is the number of leading request blocks the worker holds on
	// that tier.
	Blocks int
	// TreeSize is the number of blocks the worker holds in all on it.
	TreeSize int
}

// TierMatch is, for a worker holding blocks on a lower tier, how its
// leading run of request blocks held on any tier splits by tier: Blocks[t]
// counts the blocks of the run whose fastest tier holding them is t.
type TierMatch struct {
	Worker WorkerKey
	Blocks [kvevents.NumTiers]int
}

// Total is the length of the run.
func (t TierMatch) Total() int {
	n := 0
	for _, b := range t.Blocks {
		n += b
	}
	return n
}

// Matches is FindMatches' result. Reuse one across calls to avoid
// allocations; it is not safe for concurrent use.
type Matches struct {
	Overlaps []Overlap
	// Tiers holds one entry per worker that holds blocks on a lower tier
	// and matches at least the first block on some tier; workers without
	// lower-tier blocks have none (their GPU Overlap says it all).
	Tiers   []TierMatch
	scratch words
	slots   []int32  // index slot of each Overlaps entry
	pos     []int32  // index slot → 1 + position in Overlaps (0: none)
	path    []nodeID // matchTiers' walk
}

// TiersOf returns worker key's per-tier run (see TierMatch), or ok false
// if it holds nothing on a lower tier.
func (m *Matches) TiersOf(key WorkerKey) (TierMatch, bool) {
	for _, t := range m.Tiers {
		if t.Worker == key {
			return t, true
		}
	}
	return TierMatch{}, false
}

// ofSlot returns the overlap of the worker at index slot, checking that the
// slot still belongs to key (a slot can be reused after a removal).
func (m *Matches) ofSlot(slot int32, key WorkerKey) int {
	if slot < 0 || int(slot) >= len(m.pos) {
		return 0
	}
	p := m.pos[slot]
	if p == 0 || m.Overlaps[p-1].Worker != key || m.Overlaps[p-1].Tier != kvevents.TierGPU {
		return 0
	}
	return m.Overlaps[p-1].Blocks
}

// Of returns the GPU overlap of worker key, 0 if it matched nothing.
func (m *Matches) Of(key WorkerKey) int {
	for _, o := range m.Overlaps {
		if o.Worker == key && o.Tier == kvevents.TierGPU {
			return o.Blocks
		}
	}
	return 0
}

// FindMatches fills m with, for each worker tier holding at least the
// first block, the number of leading blocks of localHashes it holds and its
// tree size; it stops as soon as no tier of any worker matches. For workers
// holding blocks on lower tiers it fills m.Tiers too.
func (ix *Index) FindMatches(localHashes []uint64, m *Matches) {
	for _, s := range m.slots {
		m.pos[s] = 0
	}
	m.Overlaps, m.slots, m.Tiers = m.Overlaps[:0], m.slots[:0], m.Tiers[:0]
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if len(ix.tiered) > 0 {
		ix.matchTiers(localHashes, m)
	}
	id, n := rootID, ix.tree.at(rootID)
	depth := 0
	for i, h := range localHashes {
		c := ix.child(id, n, h)
		if c == 0 {
			break
		}
		cn := ix.tree.at(c)
		if i == 0 {
			m.scratch = m.scratch.load(&cn.workers, &ix.wx)
			if cn.workers.empty() {
				return
			}
		} else if !m.scratch.intersect(&cn.workers, &ix.wx, func(slot int32) { m.add(ix, slot, i) }) {
			return
		}
		id, n = c, cn
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

// matchTiers fills m.Tiers: for each worker with lower-tier slots, the
// leading run of request blocks it holds on any tier, each block counted at
// the fastest tier holding it. Caller holds mu.
func (ix *Index) matchTiers(localHashes []uint64, m *Matches) {
	m.path = m.path[:0]
	id, n := rootID, ix.tree.at(rootID)
	for _, h := range localHashes {
		c := ix.child(id, n, h)
		if c == 0 {
			break
		}
		m.path = append(m.path, c)
		id, n = c, ix.tree.at(c)
	}
	if len(m.path) == 0 {
		return
	}
	for key, ts := range ix.tiered {
		var slots [kvevents.NumTiers]int32
		for t := range slots {
			slots[t] = ts[t] - 1
		}
		if g, ok := ix.lookup(key); ok {
			slots[kvevents.TierGPU] = g
		}
		tm := TierMatch{Worker: key}
	walk:
		for _, c := range m.path {
			ws := &ix.tree.at(c).workers
			for t, s := range slots {
				if s >= 0 && ws.has(s, &ix.wx) {
					tm.Blocks[t]++
					continue walk
				}
			}
			break
		}
		if tm.Total() > 0 {
			m.Tiers = append(m.Tiers, tm)
		}
	}
}

func (m *Matches) add(ix *Index, slot int32, blocks int) {
	ss := &ix.slots[slot]
	m.Overlaps = append(m.Overlaps, Overlap{Worker: ss.key, Tier: ss.tier, Blocks: blocks, TreeSize: ss.size})
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

// TreeSize returns the number of blocks worker key holds on the GPU.
func (ix *Index) TreeSize(key WorkerKey) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if s, ok := ix.lookup(key); ok {
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
		RefUnknown:         ix.refUnknown.Load(),
		LowerTierBlocks:    ix.lower,
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
	n, nn := rootID, ix.tree.at(rootID)
	exp := now.Add(ix.ttl)
	for _, h := range localHashes {
		c := ix.child(n, nn, h)
		if c == 0 {
			c = ix.addChild(n, h)
			ix.nodes++
		}
		cn := ix.tree.at(c)
		ix.holdNode(cn, slot)
		if i := ix.approx.findOn(slot, cn); i != 0 {
			ix.approx.touch(i, exp)
		} else {
			ix.approx.pushOn(slot, c, cn, exp)
			// The bound is checked once per Record (below), and the bound
			// plus one is a hard cap: a Record filling more than the room
			// left drops the oldest as it goes, uncounted.
			if ix.approx.len > ix.maxApprox+1 {
				ix.dropApprox(ix.approx.oldest()) // never c's: c is held, so its node stays
			}
		}
		n, nn = c, cn
	}
	if ix.approx.len > ix.maxApprox {
		target := ix.maxApprox * 8 / 10
		for ix.approx.len > target {
			ix.dropApprox(ix.approx.oldest())
			ix.pruned.Add(1)
		}
	}
	ix.expireLocked(now)
}

// Expire drops approximate-mode and predicted entries whose TTL passed.
func (ix *Index) Expire(now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.expireLocked(now)
	ix.expirePredictedLocked(now)
}

func (ix *Index) expireLocked(now time.Time) {
	for {
		i := ix.approx.oldest()
		if i == 0 || !ix.approx.expired(i, now) {
			return
		}
		ix.dropApprox(i)
	}
}

// dropApprox drops approximate-mode entry i and releases its node. Caller
// holds mu.
func (ix *Index) dropApprox(i int32) {
	slot, n := ix.approx.remove(i)
	// A node can be freed while it still has an entry (detached, n is 0)
	// only if the worker was removed or another entry of the worker
	// released it; then its slot no longer holds it, and there is nothing
	// to release.
	if n == 0 {
		return
	}
	ix.release(n, slot)
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
	keys := make([]slotKey, 0, len(ix.table.byKey))
	for k := range ix.table.byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].ID != keys[j].ID {
			return keys[i].ID < keys[j].ID
		}
		if keys[i].DPRank != keys[j].DPRank {
			return keys[i].DPRank < keys[j].DPRank
		}
		return keys[i].tier < keys[j].tier
	})
	for _, key := range keys {
		out = ix.dumpSlot(out, ix.table.byKey[key])
	}
	return out
}

func (ix *Index) depthOf(n nodeID) int {
	d := 0
	for ; n != rootID; n = ix.tree.at(n).parent {
		d++
	}
	return d
}

func (ix *Index) dumpSlot(out []kvevents.RouterEvent, slot int32) []kvevents.RouterEvent {
	ss := &ix.slots[slot]
	type mapping struct {
		eh    uint64
		n     nodeID
		depth int
	}
	var ms []mapping
	for eh, n := range ss.engine {
		ms = append(ms, mapping{eh, n, ix.depthOf(n)})
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
		ix.approx.each(func(_, s int32, n nodeID) {
			if s == slot && n != 0 { // a detached entry holds nothing
				ms = append(ms, mapping{fresh(), n, ix.depthOf(n)})
			}
		})
	}
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].depth != ms[j].depth {
			return ms[i].depth < ms[j].depth
		}
		return ms[i].eh < ms[j].eh
	})
	primary := make(map[nodeID]uint64, len(ms)) // node → an engine hash of it
	standIn := make(map[nodeID]uint64)
	var standIns []uint64
	var eventID uint64
	medium := ""
	if ss.tier != kvevents.TierGPU {
		medium = ss.tier.String()
	}
	emit := func(parent *uint64, blocks []kvevents.Block) {
		eventID++
		out = append(out, kvevents.RouterEvent{WorkerID: ss.key.ID, DPRank: ss.key.DPRank, EventID: eventID,
			Event: kvevents.Event{Stored: &kvevents.Stored{ParentHash: parent, Blocks: blocks, Medium: medium}}})
	}
	// parentRef returns the engine hash to store n's children under,
	// creating stand-ins for ancestors the worker does not hold.
	var parentRef func(n nodeID) *uint64
	parentRef = func(n nodeID) *uint64 {
		if n == rootID {
			return nil
		}
		if eh, ok := primary[n]; ok {
			return &eh
		}
		if eh, ok := standIn[n]; ok {
			return &eh
		}
		nn := ix.tree.at(n)
		pp := parentRef(nn.parent)
		eh := fresh()
		standIn[n] = eh
		standIns = append(standIns, eh)
		h := nn.local
		emit(pp, []kvevents.Block{{EngineHash: eh, LocalHash: &h}})
		return &eh
	}
	for _, m := range ms {
		mn := ix.tree.at(m.n)
		p := parentRef(mn.parent)
		h := mn.local
		emit(p, []kvevents.Block{{EngineHash: m.eh, LocalHash: &h}})
		if _, ok := primary[m.n]; !ok {
			primary[m.n] = m.eh
		}
	}
	if len(standIns) > 0 {
		eventID++
		out = append(out, kvevents.RouterEvent{WorkerID: ss.key.ID, DPRank: ss.key.DPRank, EventID: eventID,
			Event: kvevents.Event{Removed: &kvevents.Removed{EngineHashes: standIns, Medium: medium}}})
	}
	return out
}

func (ix *Index) guardOf(key WorkerKey) *guardInfo {
	if ix.guard == nil {
		ix.guard = make(map[WorkerKey]*guardInfo)
	}
	g := ix.guard[key]
	if g == nil {
		g = &guardInfo{}
		ix.guard[key] = g
	}
	return g
}

// ConfigWarning is the configuration guard: when worker key holds nothing
// in the index and its stored events are being skipped, it says why and
// which flag fixes it ("" when nothing is wrong). Its stores are skipped
// either before the index (the relay's SkipNotice) or at it (blocks of the
// wrong size, ErrBlockSizeMismatch).
func (ix *Index) ConfigWarning(key WorkerKey) string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.configWarning(key)
}

func (ix *Index) configWarning(key WorkerKey) string {
	g := ix.guard[key]
	if g == nil {
		return ""
	}
	if s, ok := ix.lookup(key); ok && ix.slots[s].size > 0 {
		return ""
	}
	switch {
	case g.mismatched > 0:
		return fmt.Sprintf("%d stored events refused: %s", g.mismatched, kvevents.BlockSizeAdvice(g.engineTokens, ix.blockSize))
	case g.notice != nil:
		return fmt.Sprintf("%d engine events skipped by its relay: %s", g.notice.Events, g.notice.Message())
	}
	return ""
}

// warnOnce returns the worker's configuration warning if it has one and
// none was returned for it in the last every (the router logs it), else "".
func (ix *Index) warnOnce(key WorkerKey, now time.Time, every time.Duration) string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	g := ix.guard[key]
	if g == nil || (!g.warnedAt.IsZero() && now.Sub(g.warnedAt) < every) {
		return ""
	}
	w := ix.configWarning(key)
	if w != "" {
		g.warnedAt = now
	}
	return w
}
