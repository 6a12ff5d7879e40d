package localrouter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
)

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
	// ReserveTTL, with RequestID, makes the call a reserving probe: the
	// chosen worker is reserved for the request for ReserveTTL (its load
	// recorded, the index untouched; reserve.go) instead of the request
	// being recorded. Confirm turns the reservation into the request,
	// Release drops it, the TTL passing expires it. Over
	// routing.MaxReserveTTL: ErrReserveTTL, nothing reserved.
	ReserveTTL time.Duration

	// confirm: Confirm's commit, which drops the request's reservation
	// first, in the same placement.
	confirm bool
}

// prepare computes the request's local and sequence hashes into s.
//
// Request hashes given as hashes reuse the sequence hashes of the leading
// blocks they share with the last request prepared on the same scratch
// (the sequence hash of block i depends on blocks 0..i alone): successive
// turns of a chat, or prompts of one system prompt, are hashed from where
// they part, not from the start — a probe's own chaining was a fifth of a
// reserving probe's work (BENCHMARKS.md, "The local router's reserving
// probe"). s.seq always holds the chain of s.local's first len(s.seq)
// blocks, also after an error (both then empty).
func (r *Router) prepare(req *Request, s *scratch) (isl int, err error) {
	switch {
	case len(req.LocalHashes) > 0:
		if req.BlockSize != r.cfg.BlockSize {
			s.local, s.seq = s.local[:0], s.seq[:0]
			return 0, fmt.Errorf("%w: hashes computed for block size %d, the pool's block size is %d", ErrBlockSizeMismatch, req.BlockSize, r.cfg.BlockSize)
		}
		n := commonPrefix(s.local[:min(len(s.local), len(s.seq))], req.LocalHashes)
		s.local = append(s.local[:n], req.LocalHashes[n:]...)
		s.seq = s.seq[:n]
		isl = len(req.LocalHashes) * r.cfg.BlockSize
	case len(req.Tokens) > 0:
		s.local, s.seq = s.local[:0], s.seq[:0]
		s.local, err = kvevents.AppendRequestHashes(s.local, req.Tokens, r.cfg.BlockSize, req.LoRAName, req.CacheSalt, req.MM)
		if err != nil {
			s.local = s.local[:0]
			return 0, err
		}
		isl = len(req.Tokens)
	default:
		s.local, s.seq = s.local[:0], s.seq[:0]
		return 0, ErrEmptyRequest
	}
	if req.ISL > 0 {
		isl = req.ISL
	}
	s.seq = appendChain(s.seq, s.local)
	return isl, nil
}

// commonPrefix is the number of leading elements a and b share.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// appendChain extends seq, the sequence hashes of local's first len(seq)
// blocks, to all of local's (kvevents.AppendSequenceHashes from a prefix).
func appendChain(seq, local []uint64) []uint64 {
	for _, h := range local[len(seq):] {
		if len(seq) > 0 {
			h = kvevents.ChainHash(seq[len(seq)-1], h)
		}
		seq = append(seq, h)
	}
	return seq
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
	reserve := opts.ReserveTTL > 0 && opts.RequestID != ""
	if reserve && opts.ReserveTTL > routing.MaxReserveTTL {
		return routing.Selection{}, fmt.Errorf("%w: request %q reserves for %v, at most %v", ErrReserveTTL, opts.RequestID, opts.ReserveTTL, routing.MaxReserveTTL)
	}
	if !reserve && !opts.confirm {
		r.expireReservations(r.clock())
	}
	p, err := r.cfg.params(opts.Override)
	if err != nil {
		return routing.Selection{}, err
	}
	if o := opts.Override; o != nil && (o.OverlapScoreCredit != nil || o.PrefillLoadScale != nil) && !r.chain.readsOverride() && !r.overrideNoted.Swap(true) {
		r.log.Warn(OverrideNote(r.cfg.WorkerChain))
	}
	if req.SessionKey != "" && !r.chain.session && !r.sessionNoted.Swap(true) {
		r.log.Warn(SessionNote(r.cfg.WorkerChain))
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
		r.expireLocked(r.clock())
		switch {
		case opts.confirm:
			r.confirmLocked(opts.RequestID, *opts.Worker)
		case reserve:
			// An id already active is refused at the probe, as its
			// commit would be: the caller moves on before deciding. One
			// already reserved is reserved again (the old reservation
			// released): its release may still be on its way, and
			// whichever of the two a commit confirms, the request is
			// counted once.
			if _, active := r.active.Has(opts.RequestID); active {
				return routing.Selection{}, fmt.Errorf("%w: %q", ErrDuplicateRequest, opts.RequestID)
			}
			if _, ok := r.dropLocked(opts.RequestID); ok {
				r.res.released.Add(1)
			}
		default:
			// A decide-and-commit of a request that holds a reservation
			// (the global router found its probes contended and places it
			// anew): the reservation gives way to the placement, so the
			// request is never counted twice.
			if _, ok := r.dropLocked(opts.RequestID); ok {
				r.res.released.Add(1)
			}
		}
	}
	r.index.FindMatches(s.local, &s.matches)
	s.overlaps = s.overlaps[:0]
	for i, k := range workers {
		s.overlaps = append(s.overlaps, s.matches.ofSlot(slots[i], k))
	}
	augmented := r.creditReserved(workers, s)
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
		DecodeBlocks: l.PotentialDecodeBlocks, Cost: r.chain.selectionCost(&cs.in, i), TTFT: r.chain.selectionTTFT(&cs.in, i), ChainScore: cs.totals[k], RequestBlocks: len(s.local), Candidates: len(workers),
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
		if augmented {
			charged = min(charged, s.indexed[i]) // reserved blocks are not cached
		}
		switch {
		case recosted:
			charged = s.confirmed[i]
		case predictions && charged > 0:
			charged = r.index.ConfirmedPrefix(l.Worker, s.local, charged)
		}
		if reserve {
			now := r.clock()
			// Its blocks enter the active table when next read (the
			// next probe) or at its confirmation, after the answer:
			// a released reservation never inserts them (AddHeld).
			if err := r.active.AddHeld(now, reservationKey(opts.RequestID), l.Worker, s.seq, isl, charged, r.cfg.BlockSize); err != nil {
				return routing.Selection{}, err
			}
			// Held, not placed: the index and the saturation count learn
			// of the request at its commit. The chain's stateful scorers
			// are told now (Confirm chooses nothing): a reservation is
			// their choice.
			sel.ReservationsHeld = len(r.res.byID) // others': its own was dropped above
			r.reserveLocked(opts.RequestID, l.Worker, now, opts.ReserveTTL, s.local, isl, charged)
			for _, o := range r.chain.observers {
				o.Chosen(&cs.in, i)
			}
			return sel, nil
		}
		if err := r.active.Add(r.clock(), opts.RequestID, l.Worker, s.seq, isl, charged, r.cfg.BlockSize); err != nil {
			return routing.Selection{}, err
		}
		// Counted for requests placed, not for probes: a global router
		// probes every pool for each request.
		r.saturationSkips.Add(uint64(saturated))
		r.calibPlaced(&cs.in, i, opts.RequestID)
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
