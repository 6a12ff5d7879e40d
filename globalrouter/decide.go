package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

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
}

func (p *prepared) prompt(blockSize int) pool.Prompt {
	pr := pool.Prompt{BlockSize: blockSize, ISL: len(p.tokens), Override: p.hdr.override, LoRA: p.me.lora, Allowed: p.req.Subset.addresses()}
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
	// Headers first: a malformed one must not cost a tokenize and a hash.
	hdr, err := parseHeaders(req.Headers)
	if err != nil {
		return nil, err
	}
	if req.Subset != nil && len(req.Subset.Addresses) == 0 {
		return nil, fmt.Errorf("%w: the subset is empty", ErrNoEndpointInSubset)
	}
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
	p, err := r.prepare(req, me, hdr)
	if err != nil {
		return nil, err
	}
	if pinWorker != "" {
		return r.decidePinnedWorker(ctx, p, eligible, pinWorker)
	}
	results := r.probe(ctx, p, eligible)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	misses := filterSubset(req.Subset, results)
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
	if len(cands) == 0 {
		switch {
		case misses > 0 && misses == failed:
			return nil, fmt.Errorf("%w", errors.Join(errs(results)...))
		case pinPool != "":
			return nil, pinError(HeaderPool, pinPool, results[0].err)
		case saturated > 0 && saturated+misses == failed:
			return nil, fmt.Errorf("%w: %w", ErrSaturated, errors.Join(errs(results)...))
		}
		return nil, fmt.Errorf("%w: %w", ErrNoPool, errors.Join(errs(results)...))
	}
	var trace *policies.Trace
	if req.Explain || r.log.Enabled(ctx, slog.LevelDebug) {
		trace = &policies.Trace{}
	}
	ranked, err := st.chain.Rank(&p.view, cands, trace)
	if err != nil {
		if errors.Is(err, policies.ErrSaturated) {
			return nil, fmt.Errorf("%w: %w", ErrSaturated, err)
		}
		if pinPool != "" {
			return nil, fmt.Errorf("%w: %s: pool %q: %w", ErrPinRefused, HeaderPool, pinPool, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrNoPool, err)
	}
	return r.commit(ctx, st, p, results, ranked, trace, pinPool != "")
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
func (r *Router) prepare(req *Request, me *modelEntry, hdr headers) (*prepared, error) {
	p := &prepared{req: req, me: me, id: req.ID, hdr: hdr}
	if p.id == "" {
		p.id = fmt.Sprintf("kvgate-%016x", rand.Uint64())
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
	for i, bs := range me.blockSizes {
		if p.hashes[i], err = BlockKeys(p.tokens, bs, me.lora, req.CacheSalt, mm); err != nil {
			return nil, fmt.Errorf("hash blocks of %d tokens: %w", bs, err)
		}
	}
	p.view = hdr.view(req, p.id, len(p.tokens))
	return p, nil
}

// probe asks every eligible pool in parallel; each probe is bounded by the
// pool's probe timeout.
func (r *Router) probe(ctx context.Context, p *prepared, eligible []*poolEntry) []probeResult {
	results := make([]probeResult, len(eligible))
	one := func(i int) {
		pe := eligible[i]
		t0 := r.opts.now()
		sel, err := pe.p.Probe(ctx, p.prompt(pe.cfg.BlockSize))
		d := r.opts.now().Sub(t0)
		// The answer, completed with what the router knows, is the
		// candidate's probe, the Endpoint's selection and the explanation's.
		if sel.BlockSize == 0 {
			sel.BlockSize = pe.cfg.BlockSize
		}
		sel.ISL = len(p.tokens)
		results[i] = probeResult{pe: pe, sel: sel, err: err, dur: d}
		outcome := "ok"
		switch {
		case errors.Is(err, pool.ErrCircuitOpen):
			outcome = "circuit_open"
		case err != nil:
			outcome = "error"
		}
		r.m.probe.WithLabelValues(pe.cfg.Name, outcome).Observe(d.Seconds())
	}
	if len(eligible) == 0 {
		return results
	}
	// One goroutine fewer than pools: the caller probes the last pool.
	var wg sync.WaitGroup
	for i := range len(eligible) - 1 {
		wg.Go(func() { one(i) })
	}
	one(len(eligible) - 1)
	wg.Wait()
	return results
}
