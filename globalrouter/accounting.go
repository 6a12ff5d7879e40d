package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// Every decision accounted (issue 27 item 4). A decision whose probes
// reached no local router is not made best effort at once: the pools that
// failed for an outage are probed once more (reprobe), each with the
// longest probe deadline (pool.Pool.ProbeAgain; under CPU pressure it is
// the adaptive deadline that runs out), within the request's context. Only
// when that fails too does the decision go best effort, and then its
// commit is queued on the chosen pool (pool.Pool.CommitLate) and sent to
// the first of its routers that answers again, with the request's
// prefill-complete and free after it, in order; a request that ends first
// is taken off the queue and never committed. Each outcome is counted in
// kvgate_globalrouter_best_effort_outcomes_total.

// Outcomes of kvgate_globalrouter_best_effort_outcomes_total besides the
// late commits' own (pool.LateOutcome).
const outcomeRetriedOK = "retried_ok"

// reprobe probes again, once, the pools of results whose probe failed for
// an outage, in place, and reports whether any answered.
func (r *Router) reprobe(ctx context.Context, p *prepared, results []probeResult) bool {
	var idx []int
	var down []*poolEntry
	for i, res := range results {
		if res.err != nil && outage(res.err) {
			idx = append(idx, i)
			down = append(down, res.pe)
		}
	}
	if len(down) == 0 || ctx.Err() != nil {
		return false
	}
	again := r.probe(ctx, p, down, true)
	ok := false
	for k, res := range again {
		results[idx[k]] = res
		if res.err == nil {
			ok = true
			r.m.bestEffortOutcomes.WithLabelValues(res.pe.cfg.Name, outcomeRetriedOK).Inc()
		}
	}
	if ok {
		r.log.Info("a probe that reached no router was retried and answered", "request_id", p.id)
	}
	return ok
}

// bestEffort decides on the last known state when no eligible pool's local
// router could be reached: each pool offers a worker a recent probe named
// (round robin, ejected workers left out), the chain ranks them as usual
// (its filters still apply), and the request goes to the first; its
// commit waits for a router of that pool to answer (pool.Pool.CommitLate),
// and the decision's Lease is that late commit's. nil when no pool knows a worker or the
// chain takes none.
func (r *Router) bestEffort(ctx context.Context, st *state, p *prepared, results []probeResult, trace *policies.Trace) *Decision {
	var cands []policies.Candidate
	for _, res := range results {
		sel, ok := res.pe.p.LastKnown(p.req.Subset.allows)
		if !ok {
			continue
		}
		sel.ISL = len(p.tokens)
		cands = append(cands, candidate(probeResult{pe: res.pe, sel: sel}))
	}
	if len(cands) == 0 {
		return nil
	}
	ranked, err := st.chain.Rank(&p.view, cands, trace)
	if err != nil {
		return nil
	}
	c := ranked[0]
	d := &Decision{Primary: endpoint(c.Pool, c.Probe), ISL: len(p.tokens), RequestBlocks: c.Probe.RequestBlocks, Lease: &lease{}, BestEffort: true}
	if pe := st.byName[c.Pool]; pe != nil {
		d.DPRankBodyField = pe.cfg.DPRankBodyField
		counted := r.m.bestEffortOutcomes.MustCurryWith(map[string]string{"pool": c.Pool})
		main := pe.p.CommitLate(pool.Commit{
			RequestID: p.id, WorkerID: c.Probe.WorkerID, DPRank: c.Probe.DPRank, Prompt: p.prompt(pe.cfg.BlockSize),
		}, func(o pool.LateOutcome) { counted.WithLabelValues(string(o)).Inc() })
		d.Lease = &lease{main: main}
		d.Fallbacks = r.fallbacks(st, p, d.Primary, ranked[1:])
		if len(d.Fallbacks) > 0 {
			d.Lease = &lease{main: &movable{move: r.lateMover(p), retarget: retargeter(c.Pool, main), cur: main}}
		}
	} else {
		d.Fallbacks = r.fallbacks(st, p, d.Primary, ranked[1:])
	}
	r.m.bestEffort.WithLabelValues(c.Pool).Inc()
	r.log.Warn("no local router reachable after a retry; routing best-effort on the last known workers, the commit queued for the pool's routers", "request_id", p.id, "client_request_id", p.req.ClientID, "pool", c.Pool, "worker_id", c.Probe.WorkerID)
	if trace != nil {
		d.Explanation = explain(p, results, ranked, trace, nil) + "; best effort: no local router reachable, last known worker, committed when its router answers again"
	}
	return d
}

// A best-effort request the data plane served from a fallback (Envoy
// retried: the primary refused the connection) is accounted on the worker
// that served it, as a decided one is (Mover): while its late commit is
// still queued the commit is made to name that worker (retargeter), else
// the request is committed late on the fallback's pool under an id of its
// own (lateMover; its routers may be as unreachable as the primary's were)
// and the first late commit freed.

// retargeter returns the movable's retarget of a best-effort decision on
// poolName whose late commit's Tracker is t.
func retargeter(poolName string, t pool.Tracker) func(Endpoint) bool {
	rt, ok := t.(pool.LateRetargeter)
	if !ok {
		return nil
	}
	return func(to Endpoint) bool { return to.Pool == poolName && rt.Retarget(to.WorkerID, to.DPRank) }
}

// lateMover returns the function that moves best-effort request p to
// another endpoint: a late commit of the request (id with movedSuffix) on
// the endpoint's pool and worker, in the configuration current at the
// move, its outcome counted as the first's.
func (r *Router) lateMover(p *prepared) func(ctx context.Context, to Endpoint, refused *atomic.Pointer[error]) (pool.Tracker, error) {
	return func(_ context.Context, to Endpoint, _ *atomic.Pointer[error]) (pool.Tracker, error) {
		st := r.acquire()
		if st == nil {
			return nil, errors.New("the global router is closed")
		}
		defer st.release()
		pe := st.byName[to.Pool]
		if pe == nil {
			return nil, fmt.Errorf("pool %q is no longer configured", to.Pool)
		}
		counted := r.m.bestEffortOutcomes.MustCurryWith(map[string]string{"pool": to.Pool})
		return pe.p.CommitLate(pool.Commit{
			RequestID: p.id + movedSuffix, WorkerID: to.WorkerID, DPRank: to.DPRank, Prompt: p.prompt(pe.cfg.BlockSize),
		}, func(o pool.LateOutcome) { counted.WithLabelValues(string(o)).Inc() }), nil
	}
}

// Leases is the number of decisions Decide returned whose Lease has not
// been freed: the requests this global router placed and that are still
// in flight, which its pools' local routers should count too (every
// decision committed, a best-effort one once its late commit lands).
// Subtree commits (a parent's) are not among them.
func (r *Router) Leases() int { return int(r.leases.Load()) }

// LateCommits is the number of best-effort decisions whose commit is
// queued, not yet sent to a router of their pool (pool.Pool.Late, over
// the current configuration's pools).
func (r *Router) LateCommits() int {
	st := r.acquire()
	if st == nil {
		return 0
	}
	defer st.release()
	n := 0
	for _, pe := range st.pools {
		n += pe.p.Late()
	}
	return n
}
