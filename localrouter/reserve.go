package localrouter

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
)

// Reservations: a reserving probe (BestWorkerOptions.ReserveTTL) chooses a
// worker as a probe does and holds it for its request for a short TTL:
// the request's predicted load is recorded on the worker (ActiveSequences,
// under a key no request id can take, so every later probe and BestWorker
// sees it) but the KV index learns nothing (no approximate record, no
// predicted blocks) until the commit confirms it (Confirm). A burst of
// reserving probes therefore spreads by load as decide-and-commit does, in
// one round trip: the commit that follows is a confirmation nobody waits
// for. A reservation is released by Release (the global router chose
// another pool), by its TTL passing (counted: ReservationStats.Expired) or
// by its Channel stream ending (the server releases what its probes
// reserved).
//
// The reservation table is guarded by Router.placeMu, as every placement
// is: reserving, confirming, releasing and expiring are placements, so a
// reservation's load and its table entry change together.

// ErrReserveTTL: a reserving probe's ReserveTTL is over
// routing.MaxReserveTTL (the one bound of every caller: the gRPC server,
// its channel and the in-process clients all reach it through BestWorker).
var ErrReserveTTL = routing.ErrReserveTTL

// reservationKey is the ActiveSequences key of request id's reservation:
// a NUL cannot begin a request id the global router makes, and a client
// that sends one only reserves under its own name.
func reservationKey(id string) string { return "\x00reserved\x00" + id }

// reservation is one held worker.
type reservation struct {
	worker   WorkerKey
	deadline time.Time
	// local are the request's local block hashes, isl its length in
	// tokens and charged the overlap its load was charged with, kept so
	// that ConfirmHeld needs no prompt, even past the TTL (lapsed).
	local        []uint64
	isl, charged int
	ttl          time.Duration
}

// reservations is the Router's reservation table.
type reservations struct {
	byID map[string]reservation // guarded by Router.placeMu
	// lapsed are the reservations that expired, kept for one more TTL
	// (their deadline moved there) so that an answerless confirmation
	// arriving late (a stalled process) still records its request
	// (ConfirmHeld). Guarded by Router.placeMu.
	lapsed map[string]reservation
	// held counts the reservations, read without the lock
	// (creditReserved).
	held atomic.Int64
	// next is the earliest deadline (unix ns; MaxInt64: none), read
	// without the lock so probes check it for free.
	next atomic.Int64

	made, confirmed, released, expired, missed atomic.Uint64
}

func newReservations() *reservations {
	r := &reservations{byID: make(map[string]reservation), lapsed: make(map[string]reservation)}
	r.next.Store(math.MaxInt64)
	return r
}

// ReservationStats are a Router's reservation counters.
type ReservationStats struct {
	// Held is the reservations held now.
	Held int
	// Made, Confirmed, Released and Expired count reservations made,
	// turned into requests by a commit, released before their TTL, and
	// expired unconfirmed. Missed counts confirming commits that found no
	// reservation (expired, released, or another router's): they were
	// recorded as ordinary commits naming their worker.
	Made, Confirmed, Released, Expired, Missed uint64
}

// ReservationStats returns the reservation counters.
func (r *Router) ReservationStats() ReservationStats {
	r.placeMu.Lock()
	held := len(r.res.byID)
	r.placeMu.Unlock()
	return ReservationStats{Held: held, Made: r.res.made.Load(), Confirmed: r.res.confirmed.Load(),
		Released: r.res.released.Load(), Expired: r.res.expired.Load(), Missed: r.res.missed.Load()}
}

// Reserved reports whether request id holds a reservation, and on which
// worker.
func (r *Router) Reserved(id string) (WorkerKey, bool) {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	res, ok := r.res.byID[id]
	return res.worker, ok
}

// reserveLocked records the reservation of request id on worker, whose
// load was just added under reservationKey(id); seq are the request's
// sequence hashes. placeMu is held.
func (r *Router) reserveLocked(id string, worker WorkerKey, now time.Time, ttl time.Duration, local []uint64, isl, charged int) {
	deadline := now.Add(ttl)
	r.res.byID[id] = reservation{worker: worker, deadline: deadline, local: slices.Clone(local), isl: isl, charged: charged, ttl: ttl}
	r.res.held.Add(1)
	r.res.made.Add(1)
	if d := deadline.UnixNano(); d < r.res.next.Load() {
		r.res.next.Store(d)
	}
}

// dropLocked forgets request id's reservation and its load. placeMu is
// held. It reports the worker it held.
func (r *Router) dropLocked(id string) (WorkerKey, bool) {
	res, ok := r.res.byID[id]
	if !ok {
		return WorkerKey{}, false
	}
	delete(r.res.byID, id)
	r.active.Free(reservationKey(id))
	r.res.held.Add(-1)
	return res.worker, true
}

// Release releases request id's reservation (the request went to another
// pool). An id with no reservation returns ErrUnknownRequest and changes
// nothing.
func (r *Router) Release(ctx context.Context, id string) error {
	if err := r.check(); err != nil {
		return err
	}
	r.placeMu.Lock()
	_, ok := r.dropLocked(id)
	r.placeMu.Unlock()
	if !ok {
		return fmt.Errorf("%w: no reservation for %q", ErrUnknownRequest, id)
	}
	r.res.released.Add(1)
	return nil
}

// Confirm records request id on worker, confirming the reservation its
// probe made: the reservation's load becomes the request's, re-keyed in
// one step under placeMu (no other placement comes between, nothing is
// computed again), and the index learns the request's blocks as a
// commit's. The answer names the worker and the request's size only (no
// cost terms: nothing was chosen). A reservation on another worker (the
// caller moved the request) is released; none at all (expired, released)
// is counted as missed; either way the commit is then recorded as Commit
// would, with Commit's answer. An id already active is refused
// (ErrDuplicateRequest) and its reservation released.
func (r *Router) Confirm(ctx context.Context, id string, worker WorkerKey, req Request) (routing.Selection, error) {
	if id == "" {
		return routing.Selection{}, ErrEmptyRequestID
	}
	if err := r.check(); err != nil {
		return routing.Selection{}, err
	}
	s := r.scratch.Get().(*scratch)
	defer r.scratch.Put(s)
	isl, err := r.prepare(&req, s)
	if err != nil {
		return routing.Selection{}, err
	}
	r.placeMu.Lock()
	res, ok := r.res.byID[id]
	if !ok || res.worker != worker {
		r.placeMu.Unlock()
		return r.BestWorker(ctx, req, BestWorkerOptions{RequestID: id, Worker: &worker, confirm: true})
	}
	delete(r.res.byID, id)
	r.res.held.Add(-1)
	if err := r.active.Rename(reservationKey(id), id); err != nil {
		r.active.Free(reservationKey(id))
		r.res.released.Add(1)
		r.placeMu.Unlock()
		return routing.Selection{}, err
	}
	r.res.confirmed.Add(1)
	r.active.Settle() // its blocks, held since the probe, off the probe's path
	now := r.clock()
	switch {
	case r.predicting():
		r.index.Predict(now, worker, s.local)
	case !r.cfg.UseKVEvents:
		r.index.Record(now, worker, s.local)
	}
	r.placeMu.Unlock()
	return routing.Selection{WorkerID: worker.ID, DPRank: worker.DPRank, RequestBlocks: len(s.local), BlockSize: r.cfg.BlockSize, ISL: isl}, nil
}

// ConfirmHeld confirms the reservation request id holds on worker, as
// Confirm does, from the reservation alone (no prompt: it kept the
// request's blocks): the answerless confirmation of a channel
// (ChannelRequest.confirm). A reservation on another worker (the caller
// moved the request: the probe's worker was ejected since) is released
// and the request recorded on worker, as Confirm does. One that expired
// less than a TTL ago (the confirmation was late: a stalled process) is
// recorded from what it kept, as a commit naming its worker, and counted
// as missed. One gone otherwise (released, expired longer ago) records
// nothing, is counted as missed and returns ErrUnknownRequest. An id
// already active is refused (ErrDuplicateRequest) and its reservation
// released.
func (r *Router) ConfirmHeld(ctx context.Context, id string, worker WorkerKey) error {
	if id == "" {
		return ErrEmptyRequestID
	}
	if err := r.check(); err != nil {
		return err
	}
	r.placeMu.Lock()
	res, ok := r.res.byID[id]
	if !ok {
		res, ok = r.res.lapsed[id]
		delete(r.res.lapsed, id)
		if ok && res.worker == worker {
			// Expired before its confirmation came.
			defer r.placeMu.Unlock()
			r.res.missed.Add(1)
			now := r.clock()
			if err := r.active.Add(now, id, worker, kvevents.AppendSequenceHashes(nil, res.local), res.isl, res.charged, r.cfg.BlockSize); err != nil {
				return err
			}
			r.learnLocked(now, worker, res.local)
			return nil
		}
	}
	if !ok || res.worker != worker {
		r.placeMu.Unlock()
		if !ok || len(res.local) == 0 {
			r.res.missed.Add(1)
			return fmt.Errorf("%w: no reservation for %q", ErrUnknownRequest, id)
		}
		// Recorded on worker from the blocks the reservation kept, its
		// reservation released in the same placement (confirmLocked).
		_, err := r.BestWorker(ctx, Request{LocalHashes: res.local, BlockSize: r.cfg.BlockSize, ISL: res.isl}, BestWorkerOptions{RequestID: id, Worker: &worker, confirm: true})
		return err
	}
	defer r.placeMu.Unlock()
	delete(r.res.byID, id)
	r.res.held.Add(-1)
	if err := r.active.Rename(reservationKey(id), id); err != nil {
		r.active.Free(reservationKey(id))
		r.res.released.Add(1)
		return err
	}
	r.res.confirmed.Add(1)
	r.active.Settle() // its blocks, held since the probe, off the probe's path
	r.learnLocked(r.clock(), worker, res.local)
	return nil
}

// learnLocked has the index learn a confirmed request's blocks as a
// commit's: predicted entries, or the approximate index's record.
// placeMu is held.
func (r *Router) learnLocked(now time.Time, worker WorkerKey, local []uint64) {
	switch {
	case r.predicting():
		r.index.Predict(now, worker, local)
	case !r.cfg.UseKVEvents:
		r.index.Record(now, worker, local)
	}
}

// confirmLocked drops request id's reservation before its commit is
// recorded on worker, counting how it went. placeMu is held.
func (r *Router) confirmLocked(id string, worker WorkerKey) {
	held, ok := r.dropLocked(id)
	switch {
	case !ok:
		r.res.missed.Add(1)
	case held == worker:
		r.res.confirmed.Add(1)
	default:
		r.res.released.Add(1)
	}
}

// creditReserved credits, while reservations are held, each candidate
// worker with the leading blocks of the request active on it — held by
// reservations, or by requests, whose predicted entries credit them
// already (s.overlaps raised to them; s.indexed keeps the index's own) —
// as the predicted entries of a committed request credit it: a reserved
// worker looks to the next probe as it will once the reservation is
// confirmed, so a burst of one prompt spreads the same whether the
// confirmations landed yet or not. The blocks count as in flight, never
// as cached: a request is charged only the index's overlap. With no
// reservation held it does nothing (one atomic load). It reports whether
// it changed anything.
func (r *Router) creditReserved(workers []WorkerKey, s *scratch) bool {
	if r.res.held.Load() == 0 {
		return false
	}
	s.reserved = r.active.Prefixes(s.reserved[:0], workers, s.seq)
	changed := false
	for i, n := range s.reserved {
		if n > s.overlaps[i] {
			changed = true
		}
	}
	if !changed {
		return false
	}
	s.indexed = append(s.indexed[:0], s.overlaps...)
	for i, n := range s.reserved {
		s.overlaps[i] = max(s.overlaps[i], n)
	}
	return true
}

// expireReservations drops the reservations past their deadline at now.
// Probes call it when the earliest deadline passed (one atomic load
// otherwise); Sweep calls it too.
func (r *Router) expireReservations(now time.Time) {
	if now.UnixNano() < r.res.next.Load() {
		return
	}
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	r.expireLocked(now)
}

// expireLocked is expireReservations with placeMu held.
func (r *Router) expireLocked(now time.Time) {
	if now.UnixNano() < r.res.next.Load() {
		return
	}
	next := int64(math.MaxInt64)
	for id, res := range r.res.lapsed {
		if !now.Before(res.deadline) {
			delete(r.res.lapsed, id)
			continue
		}
		next = min(next, res.deadline.UnixNano())
	}
	for id, res := range r.res.byID {
		if !now.Before(res.deadline) {
			r.dropLocked(id)
			r.res.expired.Add(1)
			res.deadline = res.deadline.Add(res.ttl)
			r.res.lapsed[id] = res
			next = min(next, res.deadline.UnixNano())
			continue
		}
		next = min(next, res.deadline.UnixNano())
	}
	r.res.next.Store(next)
}
