package globalrouter

import (
	"context"
	"log/slog"

	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// decideAndCommit is the decision when exactly one pool is eligible: the
// probe and the commit are one call (a commit without a worker on the Track
// stream: the local router chooses and records the request at once, under
// the probe timeout), so a burst of requests cannot all choose from the
// same state before any of them is counted — the herding of probe, then
// commit. The chain still ranks the one candidate. On any failure — the
// commit refused or unanswered, the chain refusing the candidate — the
// request is freed and the decision left to the probe-then-commit path
// (fallback true), whose answers to refusals, outages and shedding stand.
// With several pools, an endpoint subset or a cost override (which a
// commit does not carry) the probes stay state-free.
func (r *Router) decideAndCommit(ctx context.Context, st *state, p *prepared, pe *poolEntry) (d *Decision, fallback bool) {
	t0 := r.opts.now()
	cctx, cancel := context.WithTimeout(ctx, st.cfg.Probe.Timeout)
	tr, sel, err := pe.p.Commit(cctx, "", pool.Commit{RequestID: p.id, Prompt: p.prompt(pe.cfg.BlockSize)})
	cancel()
	dur := r.opts.now().Sub(t0)
	if err != nil {
		return nil, true
	}
	if sel.Address == "" || !p.req.Subset.allows(sel.Address) {
		_ = tr.Free(ctx)
		return nil, true
	}
	if sel.BlockSize == 0 {
		sel.BlockSize = pe.cfg.BlockSize
	}
	sel.ISL = len(p.tokens)
	r.m.probe.WithLabelValues(pe.cfg.Name, "ok").Observe(dur.Seconds())
	res := probeResult{pe: pe, sel: sel, dur: dur}
	var trace *policies.Trace
	if p.explain || r.log.Enabled(ctx, slog.LevelDebug) {
		trace = &policies.Trace{}
	}
	ranked, err := st.chain.Rank(&p.view, []policies.Candidate{candidate(res)}, trace)
	if err != nil {
		_ = tr.Free(ctx)
		return nil, true
	}
	c := ranked[0]
	d = &Decision{Primary: endpoint(c.Pool, c.Probe), ISL: len(p.tokens), RequestBlocks: c.Probe.RequestBlocks,
		Lease: &lease{main: tr}, DPRankBodyField: pe.cfg.DPRankBodyField}
	if trace != nil {
		d.Explanation = explain(p, []probeResult{res}, ranked, trace, nil) + "; decided and committed in one call (one eligible pool)"
		r.log.Debug("decision", "request_id", p.id, "explanation", d.Explanation)
	}
	return d, false
}
