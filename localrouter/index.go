package localrouter

import (
	"errors"
	"fmt"
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
