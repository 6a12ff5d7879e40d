package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// commit records the request on the best-ranked candidate whose local
// router takes the commit, in rank order; the candidates after it are the
// fallbacks.
//
// With probe.commit: decide (the default) the commit is a
// decide-and-commit (pool.Pool.Decide): the winning pool's local router
// chooses the worker and records the request in one call, within the
// request's subset less the workers passive health ejected, and the
// decision waits for its answer (bounded by the router's probe deadline).
// That answer is the Primary, and the same-pool fallbacks are computed
// from it: a burst of identical prompts, which all probed the same idle
// state, is spread by the router's own accounting instead of herding onto
// the worker the probes named. Across pools, an answer costlier than the
// probe (the pool got busier under the decision) is contended: the request
// is placed again under Router.recheckMu and, if still costlier, rechecked
// against the other pools (recheck); a decision that cannot take the lock
// within the shortest probe deadline (probe.min_timeout) keeps its first
// placement (outcome busy: the
// contended decisions before it are slow, on a starved process, and
// waiting on them would hold it committed and unanswered). Only contended decisions take the
// lock; the others commit concurrently, so the lock is never held across
// an uncontended round trip. A refused commit (no worker left in the
// bounds, an unknown request shape, a router that cannot be reached)
// moves on to the next ranked pool (when none is left and every commit
// failed to reach its router, the decision goes best effort, its commit
// queued: accounting.go); a commit with no answer in time, or
// an answer outside the bounds (a router older than the bounds), falls
// back to the pipelined commit of the probed worker on the same pool.
//
// With probe.commit: pipelined the commit of the probed worker is sent on
// the request's stream and not waited for, so the decision costs one
// round trip to the local routers (the probe), not two, but probes can
// race ahead of commits and herd (BENCHMARKS.md, round 2). A commit that
// cannot be sent moves on to the next candidate; one the router refuses
// after the decision was made (the worker left, say) is counted, logged,
// and surfaces on the lease (ErrCommitRefused): the request still goes to
// the worker the probe chose, unaccounted on its local router.
func (r *Router) commit(ctx context.Context, st *state, p *prepared, results []probeResult, ranked []policies.Candidate, trace *policies.Trace, pinned bool) (*Decision, error) {
	var refused []string
	mode := st.cfg.Probe.Commit
	decide := mode != CommitPipelined && mode != CommitReserve
	unreached := true // every refusal so far was an outage (nothing sent)
	for i, c := range ranked {
		pe := st.byName[c.Pool]
		if pe == nil { // a policy made up a candidate
			return nil, fmt.Errorf("%w: the chain ranked pool %q, which the configuration lacks", ErrNoPool, c.Pool)
		}
		l := &lease{flow: r.flow}
		rest := ranked[i+1:]
		movable := decide && !pinned && c.Prefill == nil && len(rest) > 0
		tr, sel, note, err := r.place(ctx, pe, p, c.Probe, mode, &l.mainRefused)
		var moved string
		if err == nil && movable && note == "" && sel.Cost > c.Probe.Cost {
			// The pool got busier between its probe and its commit
			// (decisions made on the same idle state landed first): place
			// again, serialised, and let the chain decide on that answer.
			outcome := "kept"
			// The request is committed, counted on the router, while it
			// waits: the wait is bounded by the shortest probe deadline,
			// not the longest, so that a convoy of contended decisions on
			// a starved process costs each at most one quiet round trip
			// (at 250 ms, 3,716 of 7,628 decisions under two CPU hogs
			// waited it out: the p50 from commit to Decide's return was
			// 256 ms, and the requests reached their engines up to 1.5 s
			// after their routers counted them; BENCHMARKS.md).
			if r.lockRecheck(ctx, st.cfg.Probe.MinTimeout) {
				var kept bool
				tr, sel, note, kept, err = r.replace(ctx, pe, p, c.Probe, tr, sel, &l.mainRefused)
				if !kept && err == nil && note == "" && sel.Cost > c.Probe.Cost {
					c, tr, sel, rest, moved = r.recheck(ctx, st, p, c, tr, sel, rest)
				}
				<-r.recheckMu
			} else {
				// The contended decisions before it held the lock past the
				// probe deadline (a burst on a starved process): the first
				// placement stands, rather than a convoy in which every
				// request waits, committed, for the ones before it.
				outcome = "busy"
			}
			switch {
			case err != nil:
				outcome = "refused"
			case moved != "":
				outcome = "moved"
			}
			r.m.contended.WithLabelValues(pe.cfg.Name, outcome).Inc()
			if moved != "" {
				pe = st.byName[c.Pool]
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.m.refusedCommits.WithLabelValues(c.Pool).Inc()
			r.log.Warn("commit refused; trying the next candidate", "request_id", p.id, "pool", c.Pool, "worker_id", c.Probe.WorkerID, "err", err)
			refused = append(refused, fmt.Sprintf("%s/%s: %v", c.Pool, c.Probe.WorkerID, err))
			if pinned {
				return nil, pinError(HeaderPool, c.Pool, err)
			}
			unreached = unreached && outage(err)
			continue
		}
		var notes []string
		for _, n := range []string{note, moved} {
			if n != "" {
				notes = append(notes, n)
			}
		}
		d := &Decision{Primary: endpoint(c.Pool, sel), ISL: len(p.tokens), RequestBlocks: sel.RequestBlocks, TTFT: millis(sel.TTFT), Lease: l, DPRankBodyField: pe.cfg.DPRankBodyField}
		d.Fallbacks = r.fallbacks(st, p, d.Primary, rest)
		l.main = r.movableTracker(p, tr, len(d.Fallbacks))
		if c.Prefill != nil {
			if pnote, err := r.commitPrefill(ctx, st, p, c.Prefill, mode, l, d); err != nil {
				// The decode worker prefills locally rather than failing
				// a request it can serve.
				r.m.refusedCommits.WithLabelValues(c.Prefill.Pool).Inc()
				r.log.Warn("prefill commit refused; the decode worker prefills", "request_id", p.id, "pool", c.Prefill.Pool, "err", err)
				refused = append(refused, fmt.Sprintf("prefill %s/%s: %v", c.Prefill.Pool, c.Prefill.Probe.WorkerID, err))
			} else if pnote != "" {
				notes = append(notes, pnote)
			}
		}
		if trace != nil {
			shown := append([]policies.Candidate{c}, rest...)
			shown[0].Probe = sel
			if shown[0].Prefill != nil && d.Prefill != nil {
				pc := *shown[0].Prefill
				pc.Probe = d.Prefill.Selection
				shown[0].Prefill = &pc
			}
			d.Explanation = explain(p, results, shown, trace, refused)
			if decide && sel.WorkerID != c.Probe.WorkerID {
				d.Explanation += fmt.Sprintf("; decide-and-commit: %s chose worker %s (its probe had named %s)", c.Pool, sel.WorkerID, c.Probe.WorkerID)
			}
			for _, n := range notes {
				d.Explanation += "; " + n
			}
			r.log.Debug("decision", "request_id", p.id, "explanation", d.Explanation)
		}
		return d, nil
	}
	if unreached && len(refused) > 0 {
		// Every commit failed to reach its router (they answered the
		// probes a moment ago): best effort, committed late (accounting.go).
		if d := r.bestEffort(ctx, st, p, results, trace); d != nil {
			return d, nil
		}
	}
	return nil, &Refusal{Kind: ErrNoPool, Reason: "no_pool_reachable", Public: "no pool took the request; retry later",
		Err: fmt.Errorf("every ranked pool refused the commit: %v", refused)}
}

// recheck runs the chain again over the committed pool's fresh answer and
// the other candidates' probes (rest). When another pool now ranks first
// it is committed too (decide-and-commit), the chain ranks the two fresh
// answers, and the loser's commit is freed: at most one move, one commit
// and one free more, and only when the first pool's state changed under
// the decision (a burst that probed the same state). Rechecks, and the
// placements they start from (replace), are serialised (Router.recheckMu),
// and a request is held twice only inside one, so no recheck sees
// another's request held twice. It returns the candidate kept, its tracker and selection, the
// other candidates in rank order (the fallbacks) and, when the request
// moved, a note.
func (r *Router) recheck(ctx context.Context, st *state, p *prepared, c policies.Candidate, tr pool.Tracker, sel routing.Selection, rest []policies.Candidate) (policies.Candidate, pool.Tracker, routing.Selection, []policies.Candidate, string) {
	first := c
	first.Probe = sel
	again, err := st.chain.Rank(&p.view, append([]policies.Candidate{first}, rest...), nil)
	if err != nil || len(again) == 0 || again[0].Pool == c.Pool || again[0].Prefill != nil {
		return c, tr, sel, rest, ""
	}
	alt := again[0]
	ape := st.byName[alt.Pool]
	if ape == nil {
		return c, tr, sel, rest, ""
	}
	atr, asel, note, err := r.place(ctx, ape, p, alt.Probe, CommitDecide, nil)
	if err != nil || note != "" {
		if atr != nil {
			_ = atr.Free(ctx)
		}
		return c, tr, sel, rest, ""
	}
	fresh := alt
	fresh.Probe = asel
	final, err := st.chain.Rank(&p.view, []policies.Candidate{first, fresh}, nil)
	if err != nil || len(final) == 0 || final[0].Pool != alt.Pool {
		_ = atr.Free(ctx)
		return c, tr, sel, rest, ""
	}
	_ = tr.Free(ctx)
	others := []policies.Candidate{c}
	for _, o := range rest {
		if o.Pool != alt.Pool {
			others = append(others, o)
		}
	}
	return alt, atr, asel, others, fmt.Sprintf("moved from %s (worker %s, cost %.4g ms at its commit, %.4g ms at its probe) to %s (worker %s, cost %.4g ms at its commit)",
		c.Pool, sel.WorkerID, sel.Cost, c.Probe.Cost, alt.Pool, asel.WorkerID, asel.Cost)
}

// replace places request p on pool pe again, under Router.recheckMu: it
// frees the placement tr (whose answer was sel) and waits for the free's
// acknowledgement, then places the request anew, so that the answer counts
// every move the serialised decisions before it made (the first answer,
// taken without the lock, may predate them). A free that fails keeps the
// first placement (kept, with tr and sel unchanged): the request stays
// where it was committed, unchecked. An error is the new placement's: the
// request is held nowhere and the decision moves on to the next candidate.
func (r *Router) replace(ctx context.Context, pe *poolEntry, p *prepared, probed routing.Selection, tr pool.Tracker, sel routing.Selection, into *atomic.Pointer[error]) (_ pool.Tracker, _ routing.Selection, note string, kept bool, err error) {
	if err := tr.Free(ctx); err != nil {
		r.log.Warn("could not free a contended commit to place it again; keeping it", "request_id", p.id, "pool", pe.cfg.Name, "err", err)
		return tr, sel, "", true, nil
	}
	ntr, nsel, note, err := r.place(ctx, pe, p, probed, CommitDecide, into)
	return ntr, nsel, note, false, err
}

// place records request p on pool pe, whose probe named probed: a
// decide-and-commit with CommitDecide (the answer is the worker the
// request goes to), else the pipelined commit of the probed worker
// (probed itself is the answer; into receives its later refusal), which
// with CommitReserve confirms the reservation the probe made. A
// decide-and-commit with no answer in time or an answer outside the
// request's bounds falls back to the pipelined commit, and note says so;
// any other error of it is the router's refusal, or a commit that could
// not be sent, and moves the decision on to the next candidate. With
// CommitReserve, a probed worker that passive health ejected since its
// probe is not confirmed: its reservation is released and the pool
// decides and commits instead (bounded as ever).
func (r *Router) place(ctx context.Context, pe *poolEntry, p *prepared, probed routing.Selection, mode CommitMode, into *atomic.Pointer[error]) (tr pool.Tracker, sel routing.Selection, note string, err error) {
	reserved := mode == CommitReserve && p.reserve > 0
	if reserved && pe.p.Ejected(probed.Address) {
		pe.p.Release(ctx, probed.Router, p.id)
		reserved, mode = false, CommitDecide
	}
	decide := mode == CommitDecide
	_, csp := r.span(ctx, "kvgate.commit", attribute.String("kvgate.pool", pe.cfg.Name), attribute.String("kvgate.commit_mode", string(mode)), attribute.String("kvgate.worker_id", probed.WorkerID))
	if decide {
		tr, sel, err = pe.p.Decide(ctx, probed.Router, pool.Commit{RequestID: p.id, Prompt: p.prompt(pe.cfg.BlockSize)})
		if err == nil {
			endSpan(csp, nil, attribute.String("kvgate.chosen_worker_id", sel.WorkerID))
			if sel.BlockSize == 0 {
				sel.BlockSize = pe.cfg.BlockSize
			}
			sel.ISL = len(p.tokens)
			return tr, sel, "", nil
		}
		if ctx.Err() != nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pool.ErrOutOfBounds)) {
			endSpan(csp, err)
			return nil, routing.Selection{}, "", err
		}
		r.log.Warn("decide-and-commit fell back to the pipelined commit of the probed worker", "request_id", p.id, "pool", pe.cfg.Name, "worker_id", probed.WorkerID, "err", err)
		note = fmt.Sprintf("decide-and-commit on %s fell back to the probed worker (%v)", pe.cfg.Name, err)
	}
	// Unanswered (no prompt, nothing to wait for) while the reservation
	// is surely held: within half its TTL of the probe. Later, the
	// answered commit, which records the request even if the reservation
	// expired. An unanswered confirmation's span ends once it is sent.
	unanswered := reserved && r.opts.now().Sub(p.probed) < p.reserve/2
	listen := r.committed(p.id, pe.cfg.Name, probed.WorkerID, into)
	if !unanswered {
		listen = traced(csp, listen)
	}
	tr, err = pe.p.CommitAsync(ctx, probed.Router, pool.Commit{
		RequestID: p.id, WorkerID: probed.WorkerID, DPRank: probed.DPRank, Prompt: p.prompt(pe.cfg.BlockSize), Reserved: reserved, Unanswered: unanswered,
	}, listen)
	if unanswered && err == nil {
		endSpan(csp, nil)
	}
	if reserved {
		// Sent or not, the confirmation consumed the reservation: a
		// commit that could not be sent broke the stream, which released
		// it.
		p.confirmed = append(p.confirmed, pe.cfg.Name)
	}
	if err != nil {
		endSpan(csp, err)
		return nil, routing.Selection{}, "", err
	}
	return tr, probed, note, nil
}

// fallbacks are where Envoy may retry when primary refuses connections:
// the other ranked candidates, in order, then up to
// Probe.SamePoolFallbacks other recently seen workers of primary's pool
// (passive health's ejected workers and those outside the request's
// subset left out), each address once.
func (r *Router) fallbacks(st *state, p *prepared, primary Endpoint, rest []policies.Candidate) []Endpoint {
	var out []Endpoint
	seen := map[string]bool{primary.Address: true}
	for _, f := range rest {
		out = append(out, endpoint(f.Pool, f.Probe))
		seen[f.Probe.Address] = true
	}
	if n := st.cfg.Probe.SamePoolFallbacks; n > 0 {
		if pe := st.byName[primary.Pool]; pe != nil {
			for _, o := range pe.p.Others(primary.Address, n+len(rest)) {
				if n == 0 {
					break
				}
				if seen[o.Address] || !p.req.Subset.allows(o.Address) {
					continue
				}
				seen[o.Address] = true
				o.ISL = primary.ISL
				out = append(out, endpoint(primary.Pool, o))
				n--
			}
		}
	}
	return out
}

// commitPrefill commits the request on the prefill candidate c (in commit
// mode mode, as the main commit) and sets the lease's and the decision's
// prefill halves; note is place's.
func (r *Router) commitPrefill(ctx context.Context, st *state, p *prepared, c *policies.Candidate, mode CommitMode, l *lease, d *Decision) (string, error) {
	pe := st.byName[c.Pool]
	if pe == nil {
		return "", fmt.Errorf("the chain paired prefill pool %q, which the configuration lacks", c.Pool)
	}
	tr, sel, note, err := r.place(ctx, pe, p, c.Probe, mode, nil)
	if err != nil {
		return "", err
	}
	l.prefill = tr
	e := endpoint(c.Pool, sel)
	d.Prefill = &e
	return note, nil
}

// endpoint is the one place a worker choice becomes an Endpoint.
func endpoint(poolName string, s routing.Selection) Endpoint {
	return Endpoint{Pool: poolName, Selection: s}
}

// committed returns the listener of a pipelined commit's answer: a
// refusal is counted, logged and, when into is set, kept for the lease.
func (r *Router) committed(id, poolName, worker string, into *atomic.Pointer[error]) func(routing.Selection, error) {
	return func(_ routing.Selection, err error) {
		if err == nil {
			return
		}
		r.m.refusedCommits.WithLabelValues(poolName).Inc()
		r.log.Warn("commit refused after the decision; the request goes to the probed worker unaccounted", "request_id", id, "pool", poolName, "worker_id", worker, "err", err)
		if into != nil {
			err = fmt.Errorf("%w: pool %q worker %q: %w", ErrCommitRefused, poolName, worker, err)
			into.Store(&err)
		}
	}
}

// outage reports whether every error in err is a router outage (circuit
// open, no routers, unreachable, timed out, every worker ejected), not a
// refusal.
func outage(err error) bool {
	if err == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !outage(e) {
				return false
			}
		}
		return true
	}
	var pe *pool.ProbeError
	switch {
	case errors.Is(err, pool.ErrCircuitOpen), errors.Is(err, pool.ErrNoRouters), errors.Is(err, pool.ErrAllEjected):
		return true
	case errors.As(err, &pe):
		return pe.Outage() && !errors.Is(pe.Err, pool.ErrUnknownWorker) && !requestFault(pe.Err)
	case errors.Is(err, context.DeadlineExceeded):
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// requestFault: the router answered and refused this request.
func requestFault(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.OutOfRange, codes.FailedPrecondition, codes.NotFound:
		return true
	}
	return false
}

// lease is a Decision's Lease: the request on its worker's local router,
// and on the prefill worker's when disaggregated.
type lease struct {
	main    pool.Tracker
	prefill pool.Tracker
	// mainRefused is set when main's pipelined commit was refused.
	mainRefused atomic.Pointer[error]
	// flow is told a pool may have room (flow.go; nil: no flow control).
	flow *flowQueues
	// live is the Router's count of unfreed leases this one is part of
	// (nil: not counted); freed makes Free count once.
	live  *atomic.Int64
	freed atomic.Bool
	// onFree (nil: none) is told of the first Free, with the request's
	// id (WithFreeObserver).
	id     string
	onFree func(id string, at time.Time)
}

var _ Lease = (*lease)(nil)

// PrefillComplete implements Lease: the first token came back, so the
// prefill worker's part is over. A refused commit surfaces here as
// ErrCommitRefused.
func (l *lease) PrefillComplete(ctx context.Context) error {
	var err error
	if l.main != nil { // nil: nothing committed (a pool the decision had no entry for)
		err = l.main.PrefillComplete(ctx)
	}
	if refused := l.mainRefused.Load(); refused != nil {
		err = *refused
	}
	if l.prefill != nil {
		err = errors.Join(err, l.prefill.Free(ctx))
	}
	l.flow.kick() // its prefill tokens left the worker's load
	return err
}

// Free implements Lease. A refused commit has nothing to free: the stream
// is closed and nil returned.
func (l *lease) Free(ctx context.Context) error {
	if l.live != nil && !l.freed.Swap(true) {
		l.live.Add(-1)
		if l.onFree != nil {
			l.onFree(l.id, time.Now())
		}
	}
	var err error
	if l.main != nil {
		err = l.main.Free(ctx)
	}
	if l.prefill != nil {
		err = errors.Join(err, l.prefill.Free(ctx))
	}
	l.flow.kick()
	return err
}

// lockRecheck takes Router.recheckMu, waiting at most wait (and while ctx
// lives); false when it could not.
func (r *Router) lockRecheck(ctx context.Context, wait time.Duration) bool {
	select {
	case r.recheckMu <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case r.recheckMu <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}
