package localrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// Errors of Router methods (api/routing's sentinels). The gRPC service maps
// them to status codes.
var (
	ErrClosed         = routing.ErrClosed
	ErrNoWorkers      = routing.ErrNoWorkers
	ErrNotReady       = routing.ErrNotReady
	ErrUnknownWorker  = routing.ErrUnknownWorker
	ErrEmptyRequest   = routing.ErrEmptyRequest
	ErrUnknownRequest = routing.ErrUnknownRequest
	// ErrNoAllowedWorker: BestWorkerOptions.Allow admitted none of the
	// pool's workers (an endpoint subset that names none of them).
	ErrNoAllowedWorker = routing.ErrNoAllowedWorker
)

// Options are a Router's dependencies; zero values take defaults.
type Options struct {
	// Clock returns the current time (default time.Now).
	Clock func() time.Time
	// Rand breaks ties and samples at temperature > 0 (default: a random
	// source). Tests inject a seeded one.
	Rand *rand.Rand
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// SweepInterval is how often expired requests and approximate entries
	// are dropped (default 1 s; negative disables the sweeper, e.g. for
	// simulations that call Sweep themselves).
	SweepInterval time.Duration
}

// Router is one pool's KV-aware router: the KV index, the lifecycle state of
// requests in flight, the pool's membership and the cost function.
//
// Concurrency: safe for concurrent use. The per-request path (BestWorker,
// PotentialLoads) reads the membership snapshot through an atomic pointer,
// the index under its read lock, and the lifecycle state under its mutex.
// Lock order: applyMu, then memMu, then Index.mu or ActiveSequences.mu;
// the last two are never held together. placeMu (placing decisions) is
// taken before the Index's and ActiveSequences' locks, never with applyMu
// or memMu.
type Router struct {
	cfg     Config
	chain   *workerChain // built once from cfg.WorkerChain
	index   *Index
	active  *ActiveSequences
	members atomic.Pointer[members]
	memMu   sync.Mutex // serialises membership writers
	// applyMu makes "is the worker a member? then apply its event" atomic
	// with respect to RemoveWorker: appliers share it, removal takes it
	// alone, so no event of a removed worker lands after its removal.
	// Lock order: applyMu, then memMu, then the Index's and
	// ActiveSequences' own locks.
	applyMu sync.RWMutex
	// placeMu serialises placing decisions (BestWorker with a request id,
	// Commit): each sees every placement before it, so a burst of
	// decide-and-commit calls cannot all choose from the same state. Pure
	// probes never take it. Lock order: placeMu first, before the Index's
	// and ActiveSequences' locks (never with applyMu or memMu).
	placeMu sync.Mutex

	clock  func() time.Time
	randMu sync.Mutex
	rnd    *rand.Rand
	log    *slog.Logger

	scratch sync.Pool

	// sig holds the engine signals of the ranks whose metrics are scraped
	// (SetEngineSignals), an immutable map replaced whole. sigMu
	// serialises its writers and is a leaf: nothing else is locked while
	// it is held.
	sig   atomic.Pointer[map[WorkerKey]signals.Sample]
	sigMu sync.Mutex

	// stale holds the workers marked stale (SetWorkerStale): their
	// events cannot reach the router. An immutable set replaced whole
	// under staleMu, a leaf lock.
	stale   atomic.Pointer[map[string]bool]
	staleMu sync.Mutex

	unknownWorkerEvents atomic.Uint64
	saturationSkips     atomic.Uint64
	closed              atomic.Bool
	stop                chan struct{}
	done                chan struct{}

	// overrideNoted: OverrideNote was logged (once per router).
	overrideNoted atomic.Bool
}

// members is an immutable membership snapshot.
type members struct {
	keys  []WorkerKey // sorted
	slots []int32     // index slot of each key
	dp    map[string]int
}

// find returns the position of k in keys.
func (m *members) find(k WorkerKey) (int, bool) {
	i := sort.Search(len(m.keys), func(i int) bool {
		if m.keys[i].ID != k.ID {
			return m.keys[i].ID >= k.ID
		}
		return m.keys[i].DPRank >= k.DPRank
	})
	return i, i < len(m.keys) && m.keys[i] == k
}

func (m *members) has(k WorkerKey) bool {
	n, ok := m.dp[k.ID]
	return ok && int(k.DPRank) < n
}

type scratch struct {
	local, seq []uint64
	matches    Matches
	loads      []PotentialLoad
	overlaps   []int
	costs      []float64
	// confirmed: each candidate's overlap held for real, not predicted
	// (filled only while predicted entries exist).
	confirmed []int
	// allowed holds the workers (and their slots) Allow admitted.
	allowed      []WorkerKey
	allowedSlots []int32
	// fresh holds the candidates that are not stale.
	fresh      []WorkerKey
	freshSlots []int32
	// overlapEq: each candidate's overlap in GPU-block equivalents.
	overlapEq []float64
	chain     chainScratch
}

// New returns a Router. Close it to stop its sweeper; closing one Router
// never affects another.
func New(cfg Config, opts Options) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	chain, err := buildChain(cfg.WorkerChain, cfg)
	if err != nil {
		return nil, err
	}
	if chain.credit != nil {
		cfg.OverlapScoreCredit = *chain.credit
	}
	if chain.scale != nil {
		cfg.PrefillLoadScale = *chain.scale
	}
	ix, err := NewIndex(cfg.BlockSize, IndexOptions{TTL: cfg.TTL, MaxApproxEntries: cfg.MaxTreeSize, PredictedTTL: cfg.PredictedTTL})
	if err != nil {
		return nil, err
	}
	r := &Router{
		cfg:    cfg,
		chain:  chain,
		index:  ix,
		active: NewActiveSequences(),
		clock:  opts.Clock,
		rnd:    opts.Rand,
		log:    opts.Logger,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if r.clock == nil {
		r.clock = time.Now
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.log = r.log.With("component", "localrouter")
	r.members.Store(&members{dp: map[string]int{}})
	r.sig.Store(&map[WorkerKey]signals.Sample{})
	r.stale.Store(&map[string]bool{})
	r.scratch.New = func() any { return &scratch{} }
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Second
	}
	if opts.SweepInterval > 0 {
		go r.sweeper(opts.SweepInterval)
	} else {
		close(r.done)
	}
	return r, nil
}

func (r *Router) sweeper(every time.Duration) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.Sweep()
		}
	}
}

// Sweep frees requests older than the request expiry and drops expired
// approximate-mode and predicted entries. It returns the ids of the freed requests.
func (r *Router) Sweep() []string {
	now := r.clock()
	r.index.Expire(now)
	ids := r.active.Expire(now, r.cfg.RequestExpiry)
	if len(ids) > 0 {
		r.log.Warn("freed requests past their expiry", "count", len(ids), "expiry", r.cfg.RequestExpiry)
	}
	return ids
}

// Close stops the router's sweeper. Later calls fail with ErrClosed.
func (r *Router) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	close(r.stop)
	<-r.done
	return nil
}

// Config returns the router's configuration.
func (r *Router) Config() Config { return r.cfg }

// Index returns the router's KV index.
func (r *Router) Index() *Index { return r.index }

// Active returns the router's lifecycle state.
func (r *Router) Active() *ActiveSequences { return r.active }

// AddWorker adds (or resizes) worker id with dpSize data-parallel ranks.
// A worker whose dp_size shrank loses its dropped ranks' index entries and
// requests, as a removed worker does.
func (r *Router) AddWorker(id string, dpSize int) {
	if dpSize < 1 {
		dpSize = 1
	}
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.memMu.Lock()
	old := r.members.Load()
	prev := old.dp[id]
	if prev == dpSize {
		r.memMu.Unlock()
		return
	}
	r.members.Store(old.with(id, dpSize, r.index))
	r.memMu.Unlock()
	if prev > dpSize {
		r.index.RemoveRanks(id, uint32(dpSize))
		r.active.RemoveRanks(id, uint32(dpSize))
		r.setSignals(id, nil, true)
	}
}

// SetWorkerStale marks worker id stale or not. A stale worker stays a
// member (its requests stay counted, its index part is kept) but BestWorker
// does not choose it while a fresh candidate is left. The mark is the
// worker's own (membership.WorkerInfo.Stale: its KV events cannot be
// published); RemoveWorker clears it.
func (r *Router) SetWorkerStale(id string, stale bool) {
	r.staleMu.Lock()
	defer r.staleMu.Unlock()
	old := *r.stale.Load()
	if old[id] == stale {
		return
	}
	next := make(map[string]bool, len(old)+1)
	for k := range old {
		next[k] = true
	}
	if stale {
		next[id] = true
	} else {
		delete(next, id)
	}
	r.stale.Store(&next)
}

// WorkerStale reports whether worker id is marked stale.
func (r *Router) WorkerStale(id string) bool { return (*r.stale.Load())[id] }

// RemoveWorker removes worker id: its index entries and active requests are
// dropped. It returns the ids of the requests it freed.
func (r *Router) RemoveWorker(id string) []string {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.memMu.Lock()
	old := r.members.Load()
	if _, ok := old.dp[id]; ok {
		r.members.Store(old.with(id, 0, r.index))
	}
	r.memMu.Unlock()
	r.index.RemoveWorker(id)
	r.setSignals(id, nil, false)
	r.SetWorkerStale(id, false)
	return r.active.RemoveWorker(id)
}

// SetEngineSignals replaces worker id's engine signals with ranks (the
// samples of its ranks, as signals.Parse returns them; nil forgets them).
// Ranks beyond the worker's dp_size, and workers that are not members,
// are ignored, except that a worker of one rank whose engine reports one
// rank takes it whatever its label (an engine run as one rank of a larger
// DP deployment labels it with its global rank). It implements
// signals.Sink; ranks is not retained.
func (r *Router) SetEngineSignals(id string, ranks map[uint32]signals.Sample) {
	r.setSignals(id, ranks, true)
}

// setSignals replaces id's samples; keep false drops them all.
func (r *Router) setSignals(id string, ranks map[uint32]signals.Sample, keep bool) {
	r.sigMu.Lock()
	defer r.sigMu.Unlock()
	old := *r.sig.Load()
	dp := r.members.Load().dp[id] // 0 for a non-member: nothing kept
	if !keep {
		dp = 0
	}
	next := make(map[WorkerKey]signals.Sample, len(old)+len(ranks))
	changed := false
	for k, v := range old {
		if k.ID == id {
			changed = true
			continue
		}
		next[k] = v
	}
	for rank, smp := range ranks {
		if dp == 1 && len(ranks) == 1 {
			// One rank per registration (vLLM's external DP load
			// balancing: each server is one rank, labelled with its
			// global index): the one reported is the worker's.
			rank = 0
		}
		if int(rank) < dp {
			next[WorkerKey{ID: id, DPRank: rank}] = smp
			changed = true
		}
	}
	if changed {
		r.sig.Store(&next)
	}
}

// EngineSignals returns the engine signals of rank k, if scraped.
func (r *Router) EngineSignals(k WorkerKey) (signals.Sample, bool) {
	s, ok := (*r.sig.Load())[k]
	return s, ok
}

// SaturationSkips counts ranks BestWorker left out because their engine
// reported saturation (the saturation filter of the worker chain), for
// placed requests.
func (r *Router) SaturationSkips() uint64 { return r.saturationSkips.Load() }

// Saturation returns why a rank with engine signals s is saturated under
// cfg's thresholds, or "" when it is not (or both thresholds are 0).
func (c Config) Saturation(s signals.Sample) string {
	if c.SaturationWaiting > 0 && s.Waiting >= float64(c.SaturationWaiting) {
		return fmt.Sprintf("engine saturated: %g requests waiting (saturation_waiting %d)", s.Waiting, c.SaturationWaiting)
	}
	if c.SaturationKVUsage > 0 && s.HasKVUsage && s.KVUsage >= c.SaturationKVUsage && s.Waiting > 0 {
		return fmt.Sprintf("engine saturated: KV usage %.3f (saturation_kv_usage %g) with %g requests waiting", s.KVUsage, c.SaturationKVUsage, s.Waiting)
	}
	return ""
}

func (m *members) with(id string, dpSize int, ix *Index) *members {
	n := &members{dp: make(map[string]int, len(m.dp)+1)}
	for k, v := range m.dp {
		n.dp[k] = v
	}
	if dpSize == 0 {
		delete(n.dp, id)
	} else {
		n.dp[id] = dpSize
	}
	for k, v := range n.dp {
		for d := 0; d < v; d++ {
			n.keys = append(n.keys, WorkerKey{ID: k, DPRank: uint32(d)})
		}
	}
	sort.Slice(n.keys, func(i, j int) bool {
		if n.keys[i].ID != n.keys[j].ID {
			return n.keys[i].ID < n.keys[j].ID
		}
		return n.keys[i].DPRank < n.keys[j].DPRank
	})
	n.slots = make([]int32, len(n.keys))
	for i, k := range n.keys {
		n.slots[i] = ix.ensureSlot(k)
	}
	return n
}

// Workers returns the current members, one key per dp rank, sorted.
func (r *Router) Workers() []WorkerKey { return r.members.Load().keys }

// Ready reports whether at least MinInitialWorkers workers joined.
func (r *Router) Ready() bool { return len(r.members.Load().dp) >= r.cfg.MinInitialWorkers }

// ApplyEvent applies a KV event from a member worker. Events of workers that
// are not members are refused with ErrUnknownWorker and counted: their
// blocks are fetched with a dump when the worker joins.
func (r *Router) ApplyEvent(ev kvevents.RouterEvent) error {
	r.applyMu.RLock()
	defer r.applyMu.RUnlock()
	key := WorkerKey{ID: ev.WorkerID, DPRank: ev.DPRank}
	if !r.members.Load().has(key) {
		r.unknownWorkerEvents.Add(1)
		return fmt.Errorf("%w: %s/%d", ErrUnknownWorker, ev.WorkerID, ev.DPRank)
	}
	err := r.index.Apply(ev)
	if ev.Event.Skipped != nil || errors.Is(err, ErrBlockSizeMismatch) {
		// The configuration guard: say it once per worker, then rarely.
		if w := r.index.warnOnce(key, r.clock(), configWarnEvery); w != "" {
			r.log.Warn("worker's KV events are all skipped; fix its configuration", "worker", key.String(), "why", w)
		}
	}
	return err
}

// configWarnEvery bounds the configuration guard's log lines per worker.
const configWarnEvery = 10 * time.Minute

// ConfigWarning is the configuration guard's finding for a worker: why
// nothing it caches is indexed and which flag fixes it, "" when nothing
// is wrong (see Index.ConfigWarning).
func (r *Router) ConfigWarning(key WorkerKey) string { return r.index.ConfigWarning(key) }

// UnknownWorkerEvents counts events refused because their worker was not a
// member.
func (r *Router) UnknownWorkerEvents() uint64 { return r.unknownWorkerEvents.Load() }

// Request is what the router needs of a request: token ids, or the local
// block hashes computed for BlockSize (hashes win when both are given).
type Request struct {
	Tokens      []uint32
	LocalHashes []uint64
	// BlockSize the hashes were computed for; must equal the pool's.
	BlockSize int
	// ISL is the prompt length in tokens (default: len(Tokens), or
	// len(LocalHashes)*BlockSize).
	ISL      int
	LoRAName string
	// CacheSalt and MM, with Tokens, are the request's cache_salt and
	// multimodal items (see kvevents.AppendRequestHashes).
	CacheSalt string
	MM        []kvevents.MMSpan
	// SessionKey identifies the request's session (the global router
	// forwards it from a header; "" for none): the worker chain's session
	// scorer keeps a session on one worker.
	SessionKey string
}

// BestWorkerOptions select what BestWorker does besides choosing.
type BestWorkerOptions struct {
	// RequestID, when set, records the request on the chosen worker: the
	// caller must later call MarkPrefillComplete and Free. Empty: a pure
	// query, nothing changes.
	RequestID string
	// UpdateIndexer records the choice in the index without a request id
	// too: in the approximate index, or, with KV events, as predicted
	// entries (Config.PredictedTTL).
	UpdateIndexer bool
	// Override changes cost parameters for this request.
	Override *routing.Override
	// Worker forces the worker (the cost terms are still reported).
	Worker *WorkerKey
	// Signals, when set, receives the engine signals of the chosen rank
	// and the ranks skipped for engine saturation.
	Signals *SignalsReport
	// Allow, when set, restricts the choice to the workers it admits (the
	// gRPC server builds it from BestWorkerRequest.allowed_addresses). It
	// is called on the caller's goroutine, once per worker rank, and must
	// not block. None admitted: ErrNoAllowedWorker.
	Allow func(WorkerKey) bool
}

// Selected is the worker key of a selection.
func Selected(s routing.Selection) WorkerKey { return routing.Selected(s) }

// SignalsReport is the engine-signal side of a BestWorker choice, filled
// in when BestWorkerOptions.Signals points at one.
type SignalsReport struct {
	// Engine is the chosen rank's engine signals, when its metrics are
	// scraped (HasEngine).
	Engine    signals.Sample
	HasEngine bool
	// Skipped lists the ranks the worker chain's filters left out, with
	// why: engine saturation (Config.SaturationWaiting,
	// SaturationKVUsage), a LoRA adapter not loaded. A forced worker is
	// never skipped. AllSaturated: every candidate was saturated, so none
	// was skipped for it and the best of all was chosen.
	Skipped      []Skip
	AllSaturated bool
}

// Skip is a rank BestWorker left out, and why.
type Skip struct {
	Worker WorkerKey
	Reason string
}

// prepare computes the request's local and sequence hashes into s.
func (r *Router) prepare(req *Request, s *scratch) (isl int, err error) {
	s.local, s.seq = s.local[:0], s.seq[:0]
	switch {
	case len(req.LocalHashes) > 0:
		if req.BlockSize != r.cfg.BlockSize {
			return 0, fmt.Errorf("%w: hashes computed for block size %d, the pool's block size is %d", ErrBlockSizeMismatch, req.BlockSize, r.cfg.BlockSize)
		}
		s.local = append(s.local, req.LocalHashes...)
		isl = len(req.LocalHashes) * r.cfg.BlockSize
	case len(req.Tokens) > 0:
		s.local, err = kvevents.AppendRequestHashes(s.local, req.Tokens, r.cfg.BlockSize, req.LoRAName, req.CacheSalt, req.MM)
		if err != nil {
			return 0, err
		}
		isl = len(req.Tokens)
	default:
		return 0, ErrEmptyRequest
	}
	if req.ISL > 0 {
		isl = req.ISL
	}
	s.seq = kvevents.AppendSequenceHashes(s.seq, s.local)
	return isl, nil
}

func (r *Router) check() error {
	if r.closed.Load() {
		return ErrClosed
	}
	return nil
}

// BestWorker chooses the worker for req under the pool's worker chain
// (Config.WorkerChain; by default the saturation filter then the ttft
// scorer, predicted TTFT; "cost" for Dynamo's): the lowest total (temperature 0, ties at random) or a softmax
// sample (temperature > 0). Without opts.RequestID (or UpdateIndexer)
// nothing changes; with it the request is recorded.
func (r *Router) BestWorker(ctx context.Context, req Request, opts BestWorkerOptions) (routing.Selection, error) {
	if err := r.check(); err != nil {
		return routing.Selection{}, err
	}
	if err := ctx.Err(); err != nil {
		return routing.Selection{}, err
	}
	p, err := r.cfg.params(opts.Override)
	if err != nil {
		return routing.Selection{}, err
	}
	if o := opts.Override; o != nil && (o.OverlapScoreCredit != nil || o.PrefillLoadScale != nil) && !r.chain.readsOverride() && !r.overrideNoted.Swap(true) {
		r.log.Warn(OverrideNote(r.cfg.WorkerChain))
	}
	mem := r.members.Load()
	if len(mem.dp) < r.cfg.MinInitialWorkers {
		return routing.Selection{}, ErrNotReady
	}
	workers, slots := mem.keys, mem.slots
	if opts.Worker != nil {
		i, ok := mem.find(*opts.Worker)
		if !ok {
			return routing.Selection{}, fmt.Errorf("%w: %s", ErrUnknownWorker, *opts.Worker)
		}
		workers, slots = workers[i:i+1], slots[i:i+1]
	}
	if len(workers) == 0 {
		return routing.Selection{}, ErrNoWorkers
	}
	s := r.scratch.Get().(*scratch)
	defer r.scratch.Put(s)
	if opts.Allow != nil {
		s.allowed, s.allowedSlots = s.allowed[:0], s.allowedSlots[:0]
		for i, k := range workers {
			if opts.Allow(k) {
				s.allowed, s.allowedSlots = append(s.allowed, k), append(s.allowedSlots, slots[i])
			}
		}
		if len(s.allowed) == 0 {
			return routing.Selection{}, fmt.Errorf("%w (%d workers)", ErrNoAllowedWorker, len(workers))
		}
		workers, slots = s.allowed, s.allowedSlots
	}
	// Stale workers (their KV events cannot reach the router, so their
	// index part is frozen) are no candidates, unless every candidate is
	// stale (NATS itself is down): then routing goes on by load rather
	// than refusing. A pinned worker is taken as asked.
	if st := *r.stale.Load(); len(st) > 0 && opts.Worker == nil {
		s.fresh, s.freshSlots = s.fresh[:0], s.freshSlots[:0]
		for i, k := range workers {
			if !st[k.ID] {
				s.fresh, s.freshSlots = append(s.fresh, k), append(s.freshSlots, slots[i])
			}
		}
		if len(s.fresh) > 0 {
			workers, slots = s.fresh, s.freshSlots
		}
	}
	isl, err := r.prepare(&req, s)
	if err != nil {
		return routing.Selection{}, err
	}
	if opts.RequestID != "" {
		r.placeMu.Lock()
		defer r.placeMu.Unlock()
	}
	r.index.FindMatches(s.local, &s.matches)
	s.overlaps = s.overlaps[:0]
	for i, k := range workers {
		s.overlaps = append(s.overlaps, s.matches.ofSlot(slots[i], k))
	}
	s.loads = r.active.PotentialLoads(s.loads[:0], workers, s.seq, isl, r.cfg.BlockSize, s.overlaps)
	s.costs, s.overlapEq = s.costs[:0], s.overlapEq[:0]
	cold := true
	for _, l := range s.loads {
		overlap := float64(l.OverlapBlocks)
		if len(s.matches.Tiers) > 0 {
			if tm, ok := s.matches.TiersOf(l.Worker); ok {
				overlap = max(overlap, r.cfg.tierCredit(tm))
			}
		}
		cold = cold && overlap == 0
		s.overlapEq = append(s.overlapEq, overlap)
		s.costs = append(s.costs, p.cost(activePrefill(l, isl, r.cfg.BlockSize), isl, r.cfg.BlockSize, overlap, l.PotentialDecodeBlocks))
	}
	predictions := r.predicting() && r.index.hasPredicted()
	recosted := predictions && p.credit > 1
	if recosted {
		r.creditPredicted(p, s, isl)
	}
	sig := *r.sig.Load()
	if len(sig) > 0 {
		// Engine signals: their cost term, and the candidates' samples
		// for the chain (the saturation filter, the engine scorers).
		for j := range s.loads {
			l := &s.loads[j]
			if smp, ok := sig[l.Worker]; ok {
				l.Engine, l.HasEngine = smp, true
				s.costs[j] += p.engineCost(smp)
			}
		}
	}
	cs := &s.chain
	cs.in = ChainInput{Loads: s.loads, Overlap: s.overlapEq, Costs: s.costs, ISL: isl, RequestBlocks: len(s.local),
		BlockSize: r.cfg.BlockSize, LoRA: req.LoRAName, SessionKey: req.SessionKey, Cold: cold, Now: r.clock(), PoolRanks: len(mem.keys)}
	skipped, saturated, allSaturated := r.chain.run(cs, opts.Worker != nil)
	k := r.pick(cs.totals, p.temperature)
	i := cs.cand[k]
	l := s.loads[i]
	// Address and Router are the caller's to fill: it knows them.
	sel := routing.Selection{
		WorkerID: l.Worker.ID, DPRank: l.Worker.DPRank, OverlapBlocks: l.OverlapBlocks, PrefillTokens: l.PotentialPrefillTokens,
		DecodeBlocks: l.PotentialDecodeBlocks, Cost: r.chain.selectionCost(&cs.in, i), ChainScore: cs.totals[k], RequestBlocks: len(s.local), Candidates: len(workers),
		BlockSize: r.cfg.BlockSize, ISL: isl,
	}
	if r.chain.report {
		sel.Scores = r.chain.scores(cs, k)
	}
	if rep := opts.Signals; rep != nil {
		*rep = SignalsReport{Skipped: skipped, AllSaturated: allSaturated}
		rep.Engine, rep.HasEngine = sig[l.Worker]
	}
	predict := r.predicting() && (opts.UpdateIndexer || opts.RequestID != "")
	if opts.RequestID != "" {
		// The request is charged the prefill of the blocks its worker does
		// not hold for real: blocks only predicted there (another
		// request's, still being computed) attract it through the
		// overlap, but are not cached yet, so a burst of identical prompts
		// weighs on the worker it lands on and spreads by load.
		charged := sel.OverlapBlocks
		switch {
		case recosted:
			charged = s.confirmed[i]
		case predictions && charged > 0:
			charged = r.index.ConfirmedPrefix(l.Worker, s.local, charged)
		}
		if err := r.active.Add(r.clock(), opts.RequestID, l.Worker, s.seq, isl, charged, r.cfg.BlockSize); err != nil {
			return routing.Selection{}, err
		}
		// Counted for requests placed, not for probes: a global router
		// probes every pool for each request.
		r.saturationSkips.Add(uint64(saturated))
	}
	if opts.RequestID != "" || opts.UpdateIndexer {
		for _, o := range r.chain.observers {
			o.Chosen(&cs.in, i)
		}
	}
	// The approximate index learns from decisions; with KV events the
	// engine's events are the truth, and the decision only adds predicted
	// entries, which never touch a block the engine holds (predicted.go).
	switch {
	case predict:
		r.index.Predict(r.clock(), l.Worker, s.local)
	case !r.cfg.UseKVEvents && (opts.UpdateIndexer || opts.RequestID != ""):
		r.index.Record(r.clock(), l.Worker, s.local)
	}
	return sel, nil
}

func activePrefill(l PotentialLoad, isl, blockSize int) int {
	uncached := isl - l.OverlapBlocks*blockSize
	if uncached < 0 {
		uncached = 0
	}
	return l.PotentialPrefillTokens - uncached
}

// pick returns the index of the chosen cost.
func (r *Router) pick(costs []float64, temperature float64) int {
	if len(costs) == 1 {
		return 0
	}
	if temperature <= 0 {
		best, ties := 0, 1
		for i := 1; i < len(costs); i++ {
			switch {
			case costs[i] < costs[best]:
				best, ties = i, 1
			case costs[i] == costs[best]:
				ties++
				if r.intN(ties) == 0 { // reservoir: uniform among ties
					best = i
				}
			}
		}
		return best
	}
	lo, hi := costs[0], costs[0]
	for _, c := range costs {
		lo, hi = math.Min(lo, c), math.Max(hi, c)
	}
	span := hi - lo
	if span == 0 {
		return r.intN(len(costs))
	}
	var sum float64
	w := make([]float64, len(costs))
	for i, c := range costs {
		w[i] = math.Exp(-((c - lo) / span) / temperature)
		sum += w[i]
	}
	x := r.float64() * sum
	for i, v := range w {
		x -= v
		if x < 0 {
			return i
		}
	}
	return len(costs) - 1
}

func (r *Router) intN(n int) int {
	if r.rnd == nil {
		return rand.IntN(n)
	}
	r.randMu.Lock()
	defer r.randMu.Unlock()
	return r.rnd.IntN(n)
}

func (r *Router) float64() float64 {
	if r.rnd == nil {
		return rand.Float64()
	}
	r.randMu.Lock()
	defer r.randMu.Unlock()
	return r.rnd.Float64()
}

// PotentialLoads returns, for every member worker, its load if req were
// placed there.
func (r *Router) PotentialLoads(ctx context.Context, req Request) ([]PotentialLoad, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := r.scratch.Get().(*scratch)
	defer r.scratch.Put(s)
	isl, err := r.prepare(&req, s)
	if err != nil {
		return nil, err
	}
	r.index.FindMatches(s.local, &s.matches)
	mem := r.members.Load()
	s.overlaps = s.overlaps[:0]
	for i, k := range mem.keys {
		s.overlaps = append(s.overlaps, s.matches.ofSlot(mem.slots[i], k))
	}
	loads := r.active.PotentialLoads(nil, mem.keys, s.seq, isl, r.cfg.BlockSize, s.overlaps)
	if sig := *r.sig.Load(); len(sig) > 0 {
		for i := range loads {
			if smp, ok := sig[loads[i].Worker]; ok {
				loads[i].Engine, loads[i].HasEngine = smp, true
				loads[i].Saturation = r.cfg.Saturation(smp)
			}
		}
	}
	return loads, nil
}

// Commit records request id on a worker the caller chose.
func (r *Router) Commit(ctx context.Context, id string, worker WorkerKey, req Request) (routing.Selection, error) {
	if id == "" {
		return routing.Selection{}, ErrEmptyRequestID
	}
	return r.BestWorker(ctx, req, BestWorkerOptions{RequestID: id, Worker: &worker})
}

// MarkPrefillComplete marks request id's prefill done. Idempotent; an
// unknown id returns ErrUnknownRequest (and changes nothing).
func (r *Router) MarkPrefillComplete(ctx context.Context, id string) error {
	if err := r.check(); err != nil {
		return err
	}
	if !r.active.MarkPrefillComplete(id) {
		return fmt.Errorf("%w: %q", ErrUnknownRequest, id)
	}
	return nil
}

// Free forgets request id. Idempotent; an unknown id returns
// ErrUnknownRequest (and changes nothing).
func (r *Router) Free(ctx context.Context, id string) error {
	if err := r.check(); err != nil {
		return err
	}
	if !r.active.Free(id) {
		return fmt.Errorf("%w: %q", ErrUnknownRequest, id)
	}
	return nil
}

// DumpEvents returns the index as events (see Index.Dump).
func (r *Router) DumpEvents(ctx context.Context) ([]kvevents.RouterEvent, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return r.index.Dump(), nil
}
