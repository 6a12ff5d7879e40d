package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// commit records the request on the best-ranked candidate whose local
// router takes the commit, in rank order; the candidates after it are the
// fallbacks. The commit is pipelined: sent on the Track stream, not waited
// for, so the decision costs one round trip to the local routers (the
// probe), not two. A commit that cannot be sent (no router, a broken
// connection) moves on to the next candidate as before; one the router
// refuses after the decision was made (the worker left, say) is counted,
// logged, and surfaces on the lease (ErrCommitRefused): the request still
// goes to the worker the probe chose, unaccounted on its local router
// (BENCHMARKS.md, ext_proc decision section, weighs the trade).
func (r *Router) commit(ctx context.Context, st *state, p *prepared, results []probeResult, ranked []policies.Candidate, trace *policies.Trace, pinned bool) (*Decision, error) {
	var refused []string
	for i, c := range ranked {
		pe := st.byName[c.Pool]
		if pe == nil { // a policy made up a candidate
			return nil, fmt.Errorf("%w: the chain ranked pool %q, which the configuration lacks", ErrNoPool, c.Pool)
		}
		l := &lease{}
		tr, err := pe.p.CommitAsync(ctx, c.Probe.Router, pool.Commit{
			RequestID: p.id, WorkerID: c.Probe.WorkerID, DPRank: c.Probe.DPRank, Prompt: p.prompt(pe.cfg.BlockSize),
		}, r.committed(p.id, c.Pool, c.Probe.WorkerID, &l.mainRefused))
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
			continue
		}
		l.main = r.movableTracker(p, tr, len(ranked)-i-1)
		d := &Decision{Primary: endpoint(c.Pool, c.Probe), ISL: len(p.tokens), RequestBlocks: c.Probe.RequestBlocks, Lease: l, DPRankBodyField: pe.cfg.DPRankBodyField}
		if c.Prefill != nil {
			if err := r.commitPrefill(ctx, st, p, c.Prefill, l, d); err != nil {
				// The decode worker prefills locally rather than failing
				// a request it can serve.
				r.m.refusedCommits.WithLabelValues(c.Prefill.Pool).Inc()
				r.log.Warn("prefill commit refused; the decode worker prefills", "request_id", p.id, "pool", c.Prefill.Pool, "err", err)
				refused = append(refused, fmt.Sprintf("prefill %s/%s: %v", c.Prefill.Pool, c.Prefill.Probe.WorkerID, err))
			}
		}
		for _, f := range ranked[i+1:] {
			d.Fallbacks = append(d.Fallbacks, endpoint(f.Pool, f.Probe))
		}
		if trace != nil {
			d.Explanation = explain(p, results, ranked[i:], trace, refused)
			r.log.Debug("decision", "request_id", p.id, "explanation", d.Explanation)
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w: every ranked pool refused the commit: %v", ErrNoPool, refused)
}

// commitPrefill commits the request on the prefill candidate c and sets
// the lease's and the decision's prefill halves.
func (r *Router) commitPrefill(ctx context.Context, st *state, p *prepared, c *policies.Candidate, l *lease, d *Decision) error {
	pe := st.byName[c.Pool]
	if pe == nil {
		return fmt.Errorf("the chain paired prefill pool %q, which the configuration lacks", c.Pool)
	}
	tr, err := pe.p.CommitAsync(ctx, c.Probe.Router, pool.Commit{
		RequestID: p.id, WorkerID: c.Probe.WorkerID, DPRank: c.Probe.DPRank, Prompt: p.prompt(pe.cfg.BlockSize),
	}, r.committed(p.id, c.Pool, c.Probe.WorkerID, nil))
	if err != nil {
		return err
	}
	l.prefill = tr
	e := endpoint(c.Pool, c.Probe)
	d.Prefill = &e
	return nil
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

// decidePinnedWorker commits the request on the pinned worker, in the
// pinned pool or in the first eligible pool that knows the worker.
func (r *Router) decidePinnedWorker(ctx context.Context, p *prepared, eligible []*poolEntry, worker string) (*Decision, error) {
	rank := p.hdr.pinRank
	var refused []error
	for _, pe := range eligible {
		if pe.cfg.Role == policies.RolePrefill {
			continue
		}
		tr, sel, err := pe.p.Commit(ctx, "", pool.Commit{RequestID: p.id, WorkerID: worker, DPRank: rank, Prompt: p.prompt(pe.cfg.BlockSize)})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			refused = append(refused, err)
			continue
		}
		if !p.req.Subset.allows(sel.Address) {
			refused = append(refused, fmt.Errorf("pool %q: worker %s at %s: %w", pe.cfg.Name, worker, sel.Address, errSubsetMiss))
			_ = tr.Free(ctx)
			continue
		}
		if sel.BlockSize == 0 {
			sel.BlockSize = pe.cfg.BlockSize
		}
		sel.ISL = len(p.tokens)
		d := &Decision{Primary: endpoint(pe.cfg.Name, sel), ISL: len(p.tokens), RequestBlocks: sel.RequestBlocks, Lease: &lease{main: tr}, DPRankBodyField: pe.cfg.DPRankBodyField}
		if p.req.Explain {
			d.Explanation = fmt.Sprintf("model=%s isl=%d; pinned by %s=%s: pool %s, worker %s rank %d (%s), overlap %d/%d blocks",
				p.req.Model, len(p.tokens), HeaderWorkerID, worker, pe.cfg.Name, sel.WorkerID, sel.DPRank, sel.Address, sel.OverlapBlocks, sel.RequestBlocks)
		}
		return d, nil
	}
	if len(refused) == 0 {
		return nil, fmt.Errorf("%w: %s: %q: no eligible pool", ErrPinRefused, HeaderWorkerID, worker)
	}
	if subsetMissOnly(refused) {
		return nil, fmt.Errorf("%s: %q: %w", HeaderWorkerID, worker, errors.Join(refused...))
	}
	// The worker may live in a pool that is unreachable: then it is an
	// outage, whatever the other pools said.
	for _, err := range refused {
		if outage(err) {
			return nil, pinError(HeaderWorkerID, worker, err)
		}
	}
	return nil, pinError(HeaderWorkerID, worker, errors.Join(refused...))
}

// pinError is the error of a pinned request that cannot go where it is
// pinned: ErrNoPool (503, retry later) when the target's local routers are
// unreachable, ErrPinRefused (400) when the target refuses the request
// (unknown worker, wrong model, dropped by a policy). Never re-routed.
func pinError(header, target string, err error) error {
	if outage(err) {
		return fmt.Errorf("%w: %s: %q is unreachable: %w", ErrNoPool, header, target, err)
	}
	return fmt.Errorf("%w: %s: %q: %w", ErrPinRefused, header, target, err)
}

// outage reports whether every error in err is a router outage (circuit
// open, no routers, unreachable, timed out), not a refusal.
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
	case errors.Is(err, pool.ErrCircuitOpen), errors.Is(err, pool.ErrNoRouters),
		errors.As(err, &pe) && pe.Backoff > 0, errors.Is(err, context.DeadlineExceeded):
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
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
}

var _ Lease = (*lease)(nil)

// PrefillComplete implements Lease: the first token came back, so the
// prefill worker's part is over. A refused commit surfaces here as
// ErrCommitRefused.
func (l *lease) PrefillComplete(ctx context.Context) error {
	err := l.main.PrefillComplete(ctx)
	if refused := l.mainRefused.Load(); refused != nil {
		err = *refused
	}
	if l.prefill != nil {
		err = errors.Join(err, l.prefill.Free(ctx))
	}
	return err
}

// Free implements Lease. A refused commit has nothing to free: the stream
// is closed and nil returned.
func (l *lease) Free(ctx context.Context) error {
	err := l.main.Free(ctx)
	if l.prefill != nil {
		err = errors.Join(err, l.prefill.Free(ctx))
	}
	return err
}
