package localrouter

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// Errors of the lifecycle state.
var (
	// ErrDuplicateRequest: Add with a request id that is already active.
	ErrDuplicateRequest = routing.ErrDuplicateRequest
	// ErrEmptyRequestID: Add without a request id.
	ErrEmptyRequestID = routing.ErrEmptyRequestID
)

type activeReq struct {
	id        string
	slot      int32
	seq       []uint64 // sequence hashes of the request's blocks
	prefill   int      // uncached prompt tokens still to prefill
	inPrefill bool
	added     time.Time
	// held: added by AddHeld, its blocks not yet in blocks (settle).
	held bool
}

type activeWorker struct {
	key      WorkerKey
	prefill  int // sum of prefill tokens of requests still in prefill
	requests int
	distinct int // distinct active blocks
}

type blockRef struct {
	slot int32
	n    int32
}

// ActiveSequences tracks, per (worker, dp_rank), the requests in flight: the
// prefill tokens still pending and the distinct KV blocks active in decode.
//
// Concurrency: safe for concurrent use; one mutex guards everything, held
// for O(request blocks) per call.
type ActiveSequences struct {
	mu    sync.Mutex
	byID  map[string]*activeReq
	slots []activeWorker
	table slotTable[WorkerKey]
	// blocks maps a block's sequence hash to the workers it is active on,
	// with a reference count each. A worker's active blocks are prefix
	// closed: a request holds every block before its last.
	blocks map[uint64][]blockRef
	// Most blocks are active on one worker: their one-ref slices are
	// carved from chunk and, once dropped, kept in spare for the next
	// block, instead of one allocation per block added (refs.go).
	chunk  []blockRef
	spare  [][]blockRef
	prefix []int32 // scratch of activePrefix, per slot
	// held are the requests added by AddHeld whose blocks are not in
	// blocks yet: every reader of blocks or of a worker's distinct count
	// settles them first (settle); freeing one before drops it with no
	// block touched.
	held []*activeReq

	unknownOps atomic.Uint64
	expired    atomic.Uint64
	// obs is told of every request added and removed (nil: none).
	obs ActiveObserver
}

// ActiveObserver is told of each request ActiveSequences starts and stops
// counting (Stats().Requests), at that moment: how a benchmark compares,
// request by request, what the router counted with what the engines ran
// (`kvgate bench -chaos -accounting`). The calls are made under the state's
// lock, in the order the count changes: an observer must be quick, must not
// block and must not call ActiveSequences. A renamed request (a reservation
// becoming its request) is removed under its old id and added under the new.
type ActiveObserver interface {
	Added(id string, key WorkerKey, at time.Time)
	Removed(id string, key WorkerKey, at time.Time)
}

// Observe makes o (nil: none) the state's observer.
func (a *ActiveSequences) Observe(o ActiveObserver) {
	a.mu.Lock()
	a.obs = o
	a.mu.Unlock()
}

// NewActiveSequences returns an empty lifecycle state.
func NewActiveSequences() *ActiveSequences {
	return &ActiveSequences{
		byID:   make(map[string]*activeReq),
		table:  newSlotTable[WorkerKey](),
		blocks: make(map[uint64][]blockRef),
	}
}

func (a *ActiveSequences) slotFor(key WorkerKey) int32 {
	s, fresh := a.table.acquire(key)
	if fresh {
		a.slots = grow(a.slots, s)
		a.slots[s] = activeWorker{key: key}
	}
	return s
}

// Add records request id on worker key: seqHashes are its blocks' sequence
// hashes, isl its prompt length in tokens, overlapBlocks how many leading
// blocks were already cached there (blockSize tokens each). The request
// stays in prefill until MarkPrefillComplete.
func (a *ActiveSequences) Add(now time.Time, id string, key WorkerKey, seqHashes []uint64, isl, overlapBlocks, blockSize int) error {
	return a.add(now, id, key, seqHashes, isl, overlapBlocks, blockSize, false)
}

// AddHeld is Add for a reservation: the request's load counts at once for
// every reader (the workers' loads, the potential loads, the active
// prefixes all settle it first), but its blocks enter the block table
// only when something reads it, or at Settle. A reservation answered and
// then released (the request went to another pool) so never touches the
// table, and a reserving probe answers before the inserts: they were
// most of its work (BENCHMARKS.md, "The local router's reserving probe").
func (a *ActiveSequences) AddHeld(now time.Time, id string, key WorkerKey, seqHashes []uint64, isl, overlapBlocks, blockSize int) error {
	return a.add(now, id, key, seqHashes, isl, overlapBlocks, blockSize, true)
}

// Settle enters the blocks of the requests AddHeld added into the block
// table (Router.ConfirmHeld calls it once a reservation is confirmed,
// off the decision's path).
func (a *ActiveSequences) Settle() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle()
}

// settle enters the held requests' blocks. a.mu is held.
func (a *ActiveSequences) settle() {
	for i, r := range a.held {
		r.held = false
		a.insertBlocks(r)
		a.held[i] = nil
	}
	a.held = a.held[:0]
}

func (a *ActiveSequences) add(now time.Time, id string, key WorkerKey, seqHashes []uint64, isl, overlapBlocks, blockSize int, held bool) error {
	if id == "" {
		return ErrEmptyRequestID
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.byID[id]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateRequest, id)
	}
	slot := a.slotFor(key)
	prefill := isl - overlapBlocks*blockSize
	if prefill < 0 {
		prefill = 0
	}
	r := &activeReq{id: id, slot: slot, seq: append([]uint64(nil), seqHashes...), prefill: prefill, inPrefill: true, added: now}
	a.byID[id] = r
	if a.obs != nil {
		a.obs.Added(id, key, time.Now())
	}
	w := &a.slots[slot]
	w.prefill += prefill
	w.requests++
	if held {
		r.held = true
		a.held = append(a.held, r)
		return nil
	}
	a.insertBlocks(r)
	return nil
}

// insertBlocks enters request r's blocks into the block table, counting
// those new on its worker. a.mu is held.
func (a *ActiveSequences) insertBlocks(r *activeReq) {
	slot := r.slot
	w := &a.slots[slot]
	for _, h := range r.seq {
		refs := a.blocks[h]
		found := false
		for i := range refs {
			if refs[i].slot == slot {
				refs[i].n++
				found = true
				break
			}
		}
		if !found {
			a.blocks[h] = a.addRef(refs, blockRef{slot, 1})
			w.distinct++
		}
	}
}

// Rename re-keys request from as to, its load unchanged: a reservation
// becoming its request. from unknown: ErrUnknownRequest; to already
// active: ErrDuplicateRequest (nothing changes).
func (a *ActiveSequences) Rename(from, to string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.byID[from]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownRequest, from)
	}
	if _, dup := a.byID[to]; dup {
		return fmt.Errorf("%w: %q", ErrDuplicateRequest, to)
	}
	delete(a.byID, from)
	r.id = to
	a.byID[to] = r
	if a.obs != nil {
		now, key := time.Now(), a.slots[r.slot].key
		a.obs.Removed(from, key, now)
		a.obs.Added(to, key, now)
	}
	return nil
}

// MarkPrefillComplete moves request id from prefill to decode. It reports
// whether the id was known; an unknown id is a counted no-op.
func (a *ActiveSequences) MarkPrefillComplete(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.byID[id]
	if !ok {
		a.unknownOps.Add(1)
		return false
	}
	if r.inPrefill {
		r.inPrefill = false
		a.slots[r.slot].prefill -= r.prefill
	}
	return true
}

// Free forgets request id. It reports whether the id was known; an unknown
// id is a counted no-op, so Free is idempotent.
func (a *ActiveSequences) Free(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.byID[id]
	if !ok {
		a.unknownOps.Add(1)
		return false
	}
	a.freeLocked(r)
	return true
}

func (a *ActiveSequences) freeLocked(r *activeReq) {
	delete(a.byID, r.id)
	w := &a.slots[r.slot]
	if a.obs != nil {
		a.obs.Removed(r.id, w.key, time.Now())
	}
	if r.inPrefill {
		w.prefill -= r.prefill
	}
	w.requests--
	if r.held {
		// Its blocks never entered the table.
		r.held = false
		for i, o := range a.held {
			if o == r {
				last := len(a.held) - 1
				a.held[i], a.held[last] = a.held[last], nil
				a.held = a.held[:last]
				break
			}
		}
	} else {
		a.dropBlocks(r, w)
	}
	if w.requests == 0 {
		a.table.release(w.key)
		a.slots[r.slot] = activeWorker{}
	}
}

// dropBlocks removes request r's blocks (on worker w) from the block
// table. a.mu is held.
func (a *ActiveSequences) dropBlocks(r *activeReq, w *activeWorker) {
	for _, h := range r.seq {
		refs := a.blocks[h]
		for i := range refs {
			if refs[i].slot != r.slot {
				continue
			}
			refs[i].n--
			if refs[i].n == 0 {
				w.distinct--
				refs[i] = refs[len(refs)-1]
				if len(refs) == 1 {
					a.dropRefs(refs)
					delete(a.blocks, h)
				} else {
					a.blocks[h] = refs[:len(refs)-1]
				}
			}
			break
		}
	}
}

// RemoveWorker frees every request of the worker (all dp ranks) and returns
// their ids.
func (a *ActiveSequences) RemoveWorker(id string) []string { return a.RemoveRanks(id, 0) }

// RemoveRanks frees every request of worker id's ranks from fromRank up and
// returns their ids.
func (a *ActiveSequences) RemoveRanks(id string, fromRank uint32) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for _, r := range a.byID {
		if k := a.slots[r.slot].key; k.ID == id && k.DPRank >= fromRank {
			ids = append(ids, r.id)
		}
	}
	for _, rid := range ids {
		a.freeLocked(a.byID[rid])
	}
	return ids
}

// Expire frees requests added before now-maxAge (the safety net for lost
// frees) and returns their ids.
func (a *ActiveSequences) Expire(now time.Time, maxAge time.Duration) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for _, r := range a.byID {
		if now.Sub(r.added) > maxAge {
			ids = append(ids, r.id)
		}
	}
	for _, id := range ids {
		a.freeLocked(a.byID[id])
	}
	a.expired.Add(uint64(len(ids)))
	return ids
}

// Has reports whether request id is active, and on which worker.
func (a *ActiveSequences) Has(id string) (WorkerKey, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r, ok := a.byID[id]; ok {
		return a.slots[r.slot].key, true
	}
	return WorkerKey{}, false
}

// WorkerLoad is one worker's current load.
type WorkerLoad struct {
	PrefillTokens  int // prompt tokens still to prefill
	ActiveBlocks   int // distinct blocks of its active requests
	ActiveRequests int
}

// Load returns the current load of key (zero if idle).
func (a *ActiveSequences) Load(key WorkerKey) WorkerLoad {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle()
	if s, ok := a.table.lookup(key); ok {
		w := a.slots[s]
		return WorkerLoad{w.prefill, w.distinct, w.requests}
	}
	return WorkerLoad{}
}

// Loads calls f with the load of every worker that has active requests.
func (a *ActiveSequences) Loads(f func(WorkerKey, WorkerLoad)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle()
	for _, w := range a.slots {
		if w.requests > 0 {
			f(w.key, WorkerLoad{w.prefill, w.distinct, w.requests})
		}
	}
}

// activePrefix sets a.prefix[slot], for every worker slot, to the number
// of leading request blocks (given as sequence hashes) already active there.
// Caller holds a.mu.
//
// A worker's active blocks are prefix closed along a chain (a request that
// holds block i+1 holds block i, and sequence hashes name the whole
// prefix), so S(i), the set of workers with block i active, only shrinks as
// i grows. Bisection finds where each worker drops out with O(k log n)
// lookups for k distinct drop points, instead of one lookup per block.
func (a *ActiveSequences) activePrefix(seq []uint64) {
	if cap(a.prefix) < len(a.slots) {
		a.prefix = make([]int32, len(a.slots))
	}
	a.prefix = a.prefix[:len(a.slots)]
	clear(a.prefix)
	n := len(seq)
	if n == 0 {
		return
	}
	first := a.blocks[seq[0]]
	if len(first) == 0 {
		return
	}
	last := first
	if n > 1 {
		last = a.blocks[seq[n-1]]
	}
	for _, r := range last {
		a.prefix[r.slot] = int32(n)
	}
	if n > 1 {
		a.bisect(seq, 0, n-1, first, last)
	}
}

// bisect assigns the prefix of every worker in S(lo) \ S(hi), lo < hi,
// given S(lo) = atLo and S(hi) = atHi. It settles the right half first, so
// a worker still unassigned when an interval narrows to (lo, lo+1) dropped
// out exactly there.
func (a *ActiveSequences) bisect(seq []uint64, lo, hi int, atLo, atHi []blockRef) {
	if len(atLo) == len(atHi) { // S(hi) ⊆ S(lo): the same set
		return
	}
	if hi-lo == 1 {
		for _, r := range atLo {
			if a.prefix[r.slot] == 0 {
				a.prefix[r.slot] = int32(lo + 1)
			}
		}
		return
	}
	mid := lo + (hi-lo)/2
	atMid := a.blocks[seq[mid]]
	a.bisect(seq, mid, hi, atMid, atHi)
	a.bisect(seq, lo, mid, atLo, atMid)
}

// Prefixes appends to dst, for each of workers, the number of leading
// request blocks (sequence hashes seq) active on it.
func (a *ActiveSequences) Prefixes(dst []int, workers []WorkerKey, seq []uint64) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle()
	a.activePrefix(seq)
	for _, key := range workers {
		n := 0
		if s, ok := a.table.lookup(key); ok {
			n = int(a.prefix[s])
		}
		dst = append(dst, n)
	}
	return dst
}

// PotentialLoads appends to dst the potential load of each of workers if
// the request (sequence hashes seq, isl prompt tokens) were added there,
// given each worker's cached overlap in blocks (overlaps[i] for workers[i]).
func (a *ActiveSequences) PotentialLoads(dst []PotentialLoad, workers []WorkerKey, seq []uint64, isl, blockSize int, overlaps []int) []PotentialLoad {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle()
	a.activePrefix(seq)
	for i, key := range workers {
		ov := overlaps[i]
		uncached := isl - ov*blockSize
		if uncached < 0 {
			uncached = 0
		}
		p := PotentialLoad{Worker: key, PotentialPrefillTokens: uncached, PotentialDecodeBlocks: len(seq), OverlapBlocks: ov}
		if s, ok := a.table.lookup(key); ok {
			w := &a.slots[s]
			p.PotentialPrefillTokens += w.prefill
			p.PotentialDecodeBlocks += w.distinct - int(a.prefix[s])
			p.ActiveRequests = w.requests
		}
		dst = append(dst, p)
	}
	return dst
}

// PotentialLoad is what a worker's load would be with one more request.
type PotentialLoad struct {
	Worker WorkerKey
	// PotentialPrefillTokens: this request's uncached tokens plus the prefill
	// tokens of the worker's requests still in prefill.
	PotentialPrefillTokens int
	// PotentialDecodeBlocks: the worker's distinct active blocks plus this
	// request's blocks not already active there.
	PotentialDecodeBlocks int
	OverlapBlocks         int
	ActiveRequests        int
	// Engine is the rank's engine signals, when its metrics are scraped
	// (HasEngine); Saturation says why BestWorker would skip it ("" when
	// it would not). Router.PotentialLoads fills them in.
	Engine     signals.Sample
	HasEngine  bool
	Saturation string
}

// Stats of the lifecycle state.
type ActiveStats struct {
	Requests   int
	UnknownOps uint64 // MarkPrefillComplete / Free of unknown ids
	Expired    uint64
}

// Stats returns counters.
func (a *ActiveSequences) Stats() ActiveStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return ActiveStats{Requests: len(a.byID), UnknownOps: a.unknownOps.Load(), Expired: a.expired.Load()}
}
