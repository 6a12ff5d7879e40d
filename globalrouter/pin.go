package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// decidePinnedWorker commits the request on the pinned worker, in the
// pinned pool or in the first eligible pool that knows the worker. The
// chain runs first over the eligible pools (the worker is given, no
// probe): its filters apply to pins as to any request (tenancy, reserved
// priority tiers, strict SLO cells), and a pool it drops is never tried.
func (r *Router) decidePinnedWorker(ctx context.Context, st *state, p *prepared, eligible []*poolEntry, worker string) (*Decision, error) {
	rank := p.hdr.pinRank
	var cands []policies.Candidate
	for _, pe := range eligible {
		if pe.cfg.Role == policies.RolePrefill {
			continue
		}
		sel := routing.Selection{WorkerID: worker, DPRank: rank, BlockSize: pe.cfg.BlockSize, ISL: len(p.tokens)}
		cands = append(cands, candidate(probeResult{pe: pe, sel: sel}))
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("%w: %s: %q: no eligible pool", ErrPinRefused, HeaderWorkerID, worker)
	}
	trace := &policies.Trace{}
	ranked, err := st.chain.Rank(&p.view, cands, trace)
	if err != nil {
		if errors.Is(err, policies.ErrSaturated) {
			return nil, &Refusal{Kind: ErrSaturated, Public: "shed for load: " + err.Error(), Err: err}
		}
		return nil, &Refusal{Kind: ErrForbidden, Reason: "policy_refused",
			Public: fmt.Sprintf("%s: %q is not allowed for this request: %v", HeaderWorkerID, worker, err)}
	}
	var dropped []string
	for _, c := range cands {
		if !slices.ContainsFunc(ranked, func(k policies.Candidate) bool { return k.Pool == c.Pool }) {
			dropped = append(dropped, fmt.Sprintf("pool %q dropped by policy %q", c.Pool, droppedBy(trace, c.Pool)))
		}
	}
	var refused []error
	for _, c := range ranked {
		pe := st.byName[c.Pool]
		if pe == nil {
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
		if pe.p.Ejected(sel.Address) {
			_ = tr.Free(ctx)
			refused = append(refused, fmt.Errorf("pool %q: worker %s: its connections fail: %w", pe.cfg.Name, worker, pool.ErrAllEjected))
			continue
		}
		if sel.BlockSize == 0 {
			sel.BlockSize = pe.cfg.BlockSize
		}
		sel.ISL = len(p.tokens)
		d := &Decision{Primary: endpoint(pe.cfg.Name, sel), ISL: len(p.tokens), RequestBlocks: sel.RequestBlocks, TTFT: millis(sel.TTFT), Lease: &lease{main: tr, flow: r.flow}, DPRankBodyField: pe.cfg.DPRankBodyField}
		if p.explain {
			d.Explanation = fmt.Sprintf("model=%s isl=%d; pinned by %s=%s: pool %s, worker %s rank %d (%s), overlap %d/%d blocks; chain: %s",
				p.req.Model, len(p.tokens), HeaderWorkerID, worker, pe.cfg.Name, sel.WorkerID, sel.DPRank, sel.Address, sel.OverlapBlocks, sel.RequestBlocks, trace.String())
		}
		return d, nil
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
	if len(dropped) > 0 {
		// The worker is in none of the pools the request may use; maybe in
		// one the chain dropped (which is not said: a refusal must not tell
		// a caller where another tenant's workers are).
		return nil, &Refusal{Kind: ErrForbidden, Reason: "policy_refused",
			Public: fmt.Sprintf("%s: %q is not in a pool allowed for this request (%s)", HeaderWorkerID, worker, strings.Join(dropped, "; ")),
			Err:    errors.Join(refused...)}
	}
	return nil, pinError(HeaderWorkerID, worker, errors.Join(refused...))
}

// droppedBy names the chain step after which pool no longer was a
// candidate.
func droppedBy(t *policies.Trace, poolName string) string {
	for _, s := range t.Steps {
		if !slices.ContainsFunc(s.Pools, func(n string) bool { return n == poolName || strings.HasPrefix(n, poolName+"+") }) {
			return s.Policy
		}
	}
	return "the chain's end (a prefill pool alone)"
}

// pinError is the error of a pinned request that cannot go where it is
// pinned: ErrNoPool (503, retry later) when the target's local routers are
// unreachable or its workers' connections fail, ErrPinRefused (400) when
// the target refuses the request (unknown worker or rank, wrong model).
// Never re-routed.
func pinError(header, target string, err error) error {
	if outage(err) {
		return &Refusal{Kind: ErrNoPool, Reason: "no_pool_reachable", Public: fmt.Sprintf("%s: %q is unreachable; retry later", header, target), Err: err}
	}
	why := "it refused the request"
	if errors.Is(err, pool.ErrUnknownWorker) {
		why = "no such worker (or rank)"
	}
	return &Refusal{Kind: ErrPinRefused, Public: fmt.Sprintf("%s: %q cannot take the request: %s", header, target, why), Err: err}
}
