package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// probeResult is one pool's probe.
type probeResult struct {
	pe  *poolEntry
	sel routing.Selection
	err error
	dur time.Duration
}

// prepared is a request tokenized and hashed.
type prepared struct {
	req    *Request
	me     *modelEntry
	tokens []uint32
	// hashes[i] are the local hashes at me.blockSizes[i].
	hashes [][]uint64
	hdr    headers
	view   policies.Request
	id     string
	// tenant is the request's tenant as this decision's configuration
	// derived it (TenancyConfig.tenant), "" for none.
	tenant string
	// explain: the decision is to be explained to the caller.
	explain bool
	// salted: the hashes carry the tenant's salt. (A prompt shorter than
	// a block sends its tokens: it has no complete block to hash, salted
	// or not.)
	salted bool
	// engineSalt is the tenant's salt the engine must get as cache_salt
	// (Decision.CacheSalt), "" when not salted.
	engineSalt string
	// reserve is the TTL of the reservations the probes make
	// (probe.commit: reserve; 0: state-free probes), and confirmed the
	// pools whose reservation a commit confirmed (reserve.go).
	reserve   time.Duration
	confirmed []string
	// probed is when the last round of reserving probes was sent.
	probed time.Time
}

func (p *prepared) prompt(blockSize int) pool.Prompt {
	pr := pool.Prompt{BlockSize: blockSize, ISL: len(p.tokens), Override: p.hdr.override, LoRA: p.me.lora, SessionKey: p.hdr.session, Allowed: p.req.Subset.addresses()}
	for i, bs := range p.me.blockSizes {
		if bs == blockSize {
			pr.Hashes = p.hashes[i]
		}
	}
	if len(pr.Hashes) == 0 {
		pr.Tokens = p.tokens
	}
	return pr
}

func (r *Router) decide(ctx context.Context, req *Request) (*Decision, error) {
	if req == nil || req.Model == "" {
		return nil, fmt.Errorf("%w: the request names no model", ErrBadRequest)
	}
	st := r.acquire()
	if st == nil {
		return nil, fmt.Errorf("%w: the global router is closed", ErrNoPool)
	}
	defer st.release()
	me := st.model(req.Model)
	if me == nil {
		return nil, fmt.Errorf("%w: no pool serves model %q", ErrUnknownModel, req.Model)
	}
	if limit := st.cfg.maxBodyBytes(req.Model); limit > 0 && req.BodyBytes > limit {
		return nil, fmt.Errorf("%w: request body exceeds %d bytes, the limit of model %q", ErrBodyTooLarge, limit, req.Model)
	}
	// Headers first: a malformed one must not cost a tokenize and a hash;
	// a steering one from a caller who may not steer is refused before
	// its value is looked at.
	hdr, err := parseHeaders(req.Headers)
	trusted := st.cfg.Trust.trusted(req.Headers)
	if hdr.steering != "" && !st.cfg.Trust.Steering.allows(trusted) {
		msg := hdr.steering + " is honoured for trusted callers only"
		if st.cfg.Trust.Steering == AccessOff {
			msg = hdr.steering + " is disabled"
		}
		return nil, &Refusal{Kind: ErrForbidden, Reason: "untrusted_header", Public: msg}
	}
	if st.cfg.objectivePriority(req.Headers, &hdr, trusted) {
		return nil, &Refusal{Kind: ErrForbidden, Reason: "untrusted_header", Public: HeaderObjective + " is honoured for trusted callers only"}
	}
	// The tenant, once, from this decision's snapshot: the salting and
	// the policies below read this field, never the header again.
	tenant, terr := st.cfg.Tenancy.tenant(req, trusted)
	if terr != nil {
		return nil, terr
	}
	if err != nil {
		return nil, err
	}
	if err := st.cfg.Tenancy.checkExtraKey(req); err != nil {
		return nil, err
	}
	if req.Subset != nil && len(req.Subset.Addresses) == 0 {
		return nil, fmt.Errorf("%w: the subset is empty", ErrNoEndpointInSubset)
	}
	expose := st.cfg.Trust.RoutingHeaders.allows(trusted)
	pinPool, pinWorker := hdr.pinPool, hdr.pinWorker
	eligible := me.pools
	if pinPool != "" {
		pe := st.byName[pinPool]
		switch {
		case pe == nil:
			return nil, fmt.Errorf("%w: %s: no pool %q", ErrPinRefused, HeaderPool, pinPool)
		case !pe.cfg.Serves(req.Model):
			return nil, fmt.Errorf("%w: %s: pool %q does not serve model %q", ErrPinRefused, HeaderPool, pinPool, req.Model)
		}
		eligible = []*poolEntry{pe}
	}
	_, tsp := r.span(ctx, "kvgate.tokenize")
	p, err := r.prepare(req, me, hdr, &st.cfg.Tenancy, tenant)
	if p != nil {
		endSpan(tsp, err, attribute.Int("kvgate.isl", len(p.tokens)))
	} else {
		endSpan(tsp, err)
	}
	if err != nil {
		return nil, err
	}
	p.explain = req.Explain && expose
	var d *Decision
	if pinWorker != "" {
		d, err = r.decidePinnedWorker(ctx, st, p, eligible, pinWorker)
	} else {
		d, err = r.decideProbed(ctx, st, p, eligible, pinPool)
	}
	r.noteUnreadHeaders(st, req.Headers, pinWorker != "", d) // unreadhdr.go
	if d != nil {
		d.CacheSalt = p.engineSalt
		d.Expose = expose
		d.explained = d.Explanation
		if !expose {
			d.Explanation = ""
		}
	}
	return d, err
}

// decideProbed probes the eligible pools, ranks them and commits.
func (r *Router) decideProbed(ctx context.Context, st *state, p *prepared, eligible []*poolEntry, pinPool string) (*Decision, error) {
	if st.cfg.Probe.Commit == CommitReserve {
		p.reserve = st.cfg.Probe.ReserveTTL
		p.probed = r.opts.now()
	}
	results := r.probe(ctx, p, eligible, false)
	if p.reserve > 0 {
		locked := false
		if contended(results) {
			results, locked = r.reprobeContended(ctx, st, p, eligible, results)
		}
		// However the decision ends, the reservations no commit confirmed
		// are released (those of probes that answered, the retried ones
		// of reprobe included: it fills results in place), and then the
		// recheck lock a contended decision took.
		defer func() {
			r.releaseReservations(ctx, p, heldReservations(results))
			if locked {
				<-r.recheckMu
			}
		}()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	retried := false
again:
	misses := filterSubset(p.req.Subset, results)
	cands := make([]policies.Candidate, 0, len(results))
	var failed, saturated int
	for _, res := range results {
		if res.err != nil {
			failed++
			if status.Code(res.err) == codes.ResourceExhausted {
				saturated++
			}
			continue
		}
		cands = append(cands, candidate(res))
	}
	var trace *policies.Trace
	if p.explain || r.log.Enabled(ctx, slog.LevelDebug) || r.opts.explainObs.take(r.opts.now()) {
		trace = &policies.Trace{}
	}
	if len(cands) == 0 && !retried && misses < failed && pinPool == "" && !(saturated > 0 && saturated+misses == failed) &&
		outage(errors.Join(errs(results)...)) {
		// No router reached: probe the unreached pools once more before
		// going best effort (accounting.go).
		retried = true
		if r.reprobe(ctx, p, results) {
			goto again
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	if len(cands) == 0 {
		switch {
		case misses > 0 && misses == failed:
			// The client learns the rule, not which pools and workers
			// the model has (other tenants' among them).
			return nil, &Refusal{Kind: ErrNoEndpointInSubset, Reason: "no_endpoint_in_subset", Public: "no endpoint in the request's subset can take it", Err: errors.Join(errs(results)...)}
		case pinPool != "":
			return nil, pinError(HeaderPool, pinPool, results[0].err)
		case saturated > 0 && saturated+misses == failed:
			return nil, &Refusal{Kind: ErrSaturated, Public: "every eligible pool is saturated; retry later", Err: errors.Join(errs(results)...)}
		}
		if outage(errors.Join(errs(results)...)) {
			if d := r.bestEffort(ctx, st, p, results, trace); d != nil {
				return d, nil
			}
		}
		return nil, r.noPool(st, p, results, nil)
	}
	if sat, need := flowSaturated(&st.cfg.FlowControl, cands, len(p.tokens), p.view.Priority); sat {
		return nil, &Refusal{Kind: ErrSaturated, Reason: "saturated", Public: "every eligible pool is saturated; retry later", TTFT: need}
	}
	ranked, err := st.chain.Rank(&p.view, cands, trace)
	if err != nil {
		switch {
		case errors.Is(err, policies.ErrSaturated):
			return nil, &Refusal{Kind: ErrSaturated, Public: "shed for load: " + err.Error(), Err: err}
		case pinPool != "":
			return nil, &Refusal{Kind: ErrForbidden, Reason: "policy_refused",
				Public: fmt.Sprintf("%s: pool %q is not allowed for this request: %v", HeaderPool, pinPool, err)}
		}
		// The chain dropped the pools that answered; one that did not may
		// be the request's (its tenant's, say): best effort there.
		var down []probeResult
		for _, res := range results {
			if res.err != nil && outage(res.err) {
				down = append(down, res)
			}
		}
		if len(down) > 0 && !retried {
			retried = true
			if r.reprobe(ctx, p, results) {
				goto again
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		if len(down) > 0 {
			if d := r.bestEffort(ctx, st, p, down, trace); d != nil {
				return d, nil
			}
		}
		return nil, r.noPool(st, p, results, err)
	}
	r.shadow(st, p, cands, ranked[0]) // never waited for, never commits
	return r.commit(ctx, st, p, results, ranked, trace, pinPool != "")
}

// noPool is the error of a request no pool can take: when a pool the chain
// would have accepted could not be reached, the cause is that outage (503
// naming the unreachable pools), not the policy that dropped the pools that
// answered; otherwise the chain's reason.
func (r *Router) noPool(st *state, p *prepared, results []probeResult, chainErr error) error {
	var down []policies.Candidate
	var names []string
	for _, res := range results {
		if res.err != nil && outage(res.err) {
			down = append(down, candidate(probeResult{pe: res.pe, sel: res.sel}))
		}
	}
	if chainErr != nil && len(down) > 0 {
		// Would the chain have taken a pool that was down?
		if ranked, err := st.chain.Rank(&p.view, down, nil); err == nil {
			for _, c := range ranked {
				names = append(names, c.Pool)
			}
		}
	} else if chainErr == nil {
		for _, c := range down {
			names = append(names, c.Pool)
		}
	}
	joined := errors.Join(errs(results)...)
	if len(names) > 0 {
		return &Refusal{Kind: ErrNoPool, Reason: "no_pool_reachable", RetryAfter: retryAfter(st, names),
			Public: fmt.Sprintf("no pool is reachable: %s %s unreachable; retry later", strings.Join(names, ", "), plural(len(names), "is", "are")),
			Err:    errors.Join(chainErr, joined)}
	}
	if chainErr == nil {
		chainErr = errors.New("no eligible pool")
	}
	return &Refusal{Kind: ErrNoPool, Reason: "no_pool_allowed", Public: "no pool accepts the request: " + chainErr.Error(), Err: errors.Join(chainErr, joined)}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// retryAfter is when the soonest circuit of the named pools lets a trial
// through (at least a second), 0 when none is open.
func retryAfter(st *state, pools []string) time.Duration {
	var soonest time.Duration
	now := time.Now()
	for _, name := range pools {
		pe := st.byName[name]
		if pe == nil {
			continue
		}
		for _, rs := range pe.p.Routers() {
			if rs.State != pool.CircuitOpen {
				continue
			}
			if d := rs.OpenUntil.Sub(now); d > 0 && (soonest == 0 || d < soonest) {
				soonest = d
			}
		}
	}
	if soonest > 0 && soonest < time.Second {
		soonest = time.Second
	}
	return soonest
}

func errs(results []probeResult) []error {
	var out []error
	for _, r := range results {
		if r.err != nil {
			out = append(out, r.err)
		}
	}
	return out
}

// candidate is a probed pool as the policies see it; its Probe is the
// probe's answer, which commit uses as it is.
func candidate(res probeResult) policies.Candidate {
	return policies.Candidate{
		Pool: res.pe.cfg.Name, Role: res.pe.cfg.Role, Models: res.pe.cfg.Models, Weight: res.pe.cfg.Weight,
		Health: res.pe.p.Health(), Probe: res.sel,
	}
}

// prepare tokenizes the request once and hashes it once per distinct block
// size of the model's pools.
func (r *Router) prepare(req *Request, me *modelEntry, hdr headers, ten *TenancyConfig, tenant string) (*prepared, error) {
	p := &prepared{req: req, me: me, id: req.ID, hdr: hdr, tenant: tenant}
	if p.id == "" {
		p.id = newID()
	}
	t0 := r.opts.now()
	var (
		err error
		mm  []kvevents.MMSpan
	)
	switch {
	case req.Chat != nil && len(req.Chat.Messages) > 0:
		p.tokens, mm, err = EncodeChat(me.tok, req.Chat)
	case len(req.PromptTokens) > 0:
		p.tokens = req.PromptTokens
	case req.Prompt != "":
		p.tokens, err = me.tok.Encode(req.Prompt)
	default:
		return nil, fmt.Errorf("%w: the request has no prompt or messages", ErrBadRequest)
	}
	r.m.tokenize.Observe(r.opts.now().Sub(t0).Seconds())
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return nil, fmt.Errorf("%w: model %q: %w", ErrBadRequest, req.Model, err)
		}
		return nil, fmt.Errorf("tokenize for model %q: %w", req.Model, err)
	}
	if len(p.tokens) == 0 {
		return nil, fmt.Errorf("%w: the prompt is empty", ErrBadRequest)
	}
	p.hashes = make([][]uint64, len(me.blockSizes))
	salt, salted, err := ten.salt(tenant, req.CacheSalt)
	if err != nil {
		return nil, err
	}
	p.salted = salted
	if salted {
		p.engineSalt = salt
	}
	for i, bs := range me.blockSizes {
		if p.hashes[i], err = BlockKeys(p.tokens, bs, me.lora, salt, mm); err != nil {
			return nil, fmt.Errorf("hash blocks of %d tokens: %w", bs, err)
		}
	}
	p.view = hdr.view(req, p.id, len(p.tokens))
	ten.view(&p.view, tenant)
	return p, nil
}

// probe asks every eligible pool in parallel; each probe is bounded by the
// pool's probe timeout.
func (r *Router) probe(ctx context.Context, p *prepared, eligible []*poolEntry, again bool) []probeResult {
	results := make([]probeResult, len(eligible))
	one := func(i int) {
		pe := eligible[i]
		t0 := r.opts.now()
		pctx, psp := r.span(ctx, "kvgate.probe", attribute.String("kvgate.pool", pe.cfg.Name))
		pr := p.prompt(pe.cfg.BlockSize)
		if p.reserve > 0 {
			pr.ReserveID, pr.ReserveTTL = p.id, p.reserve
		}
		probe := pe.p.Probe
		if again {
			probe = pe.p.ProbeAgain
		}
		sel, err := probe(pctx, pr)
		d := r.opts.now().Sub(t0)
		// The answer, completed with what the router knows, is the
		// candidate's probe, the Endpoint's selection and the explanation's.
		if sel.BlockSize == 0 {
			sel.BlockSize = pe.cfg.BlockSize
		}
		sel.ISL = len(p.tokens)
		results[i] = probeResult{pe: pe, sel: sel, err: err, dur: d}
		outcome := "ok"
		var perr *pool.ProbeError
		switch {
		case errors.Is(err, pool.ErrCircuitOpen):
			outcome = "circuit_open"
		case errors.As(err, &perr) && perr.Local:
			outcome = "starved" // our deadline fired late: CPU pressure here
		case errors.As(err, &perr) && perr.Timeout:
			outcome = "timeout"
		case err != nil:
			outcome = "error"
		}
		r.m.probe.WithLabelValues(pe.cfg.Name, outcome).Observe(d.Seconds())
		endSpan(psp, err, attribute.String("kvgate.outcome", outcome), attribute.String("kvgate.worker_id", sel.WorkerID), attribute.Int("kvgate.overlap_blocks", sel.OverlapBlocks))
	}
	if len(eligible) == 0 {
		return results
	}
	// The caller probes the last pool; the router's long-lived probers
	// the others (probers.go): no goroutine started per decision.
	var wg sync.WaitGroup
	for i := range len(eligible) - 1 {
		wg.Add(1)
		r.probers.run(func() { defer wg.Done(); one(i) })
	}
	one(len(eligible) - 1)
	wg.Wait()
	return results
}

// newID is a request id for a request that came without one
// ("kvgate-" and 16 hex digits), without fmt on the request's path.
func newID() string {
	var b [23]byte
	copy(b[:], "kvgate-")
	v := rand.Uint64()
	for i := 22; i >= 7; i-- {
		b[i] = "0123456789abcdef"[v&0xf]
		v >>= 4
	}
	return string(b[:])
}
