package pool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
)

// ProbeError is a failed probe: which router, what kind of failure, and
// whether its circuit was opened.
type ProbeError struct {
	Pool   string
	Router string
	// Backoff is how long the router's circuit stays open when this probe
	// opened it (0: the circuit was not opened by it: below its
	// thresholds, already open, or the failure was not the router's).
	Backoff time.Duration
	// Timeout: the probe ran past its deadline. Local: it did so because
	// the global router itself was starved (the deadline fired much later
	// than set), which says nothing of the router and counts against no
	// circuit.
	Timeout, Local bool
	// Request: the router refused this request (malformed, too large);
	// the router is up.
	Request bool
	Err     error
}

func (e *ProbeError) Error() string {
	s := fmt.Sprintf("pool %q: probe %s: %v", e.Pool, e.Router, e.Err)
	if e.Local {
		s += " (the global router was starved of CPU)"
	}
	if e.Backoff > 0 {
		s += fmt.Sprintf(" (circuit open for %v)", e.Backoff)
	}
	return s
}

func (e *ProbeError) Unwrap() error { return e.Err }

// Outage reports whether the probe failed because the pool could not be
// reached (not because it refused the request).
func (e *ProbeError) Outage() bool { return !e.Request }

// Probe asks one of the pool's local routers for its best worker, under the
// probe deadline. A router that fails or times out counts against its
// circuit (CircuitOptions say when it opens); when every circuit is open
// the error wraps ErrCircuitOpen and nothing is sent. A best worker that
// passive health ejected is replaced by the router's best other worker
// (PotentialLoads); when the router knows no other, the error wraps
// ErrAllEjected.
func (p *Pool) Probe(ctx context.Context, pr Prompt) (routing.Selection, error) {
	return p.probe(ctx, pr, false)
}

// ProbeAgain is Probe given the longest deadline (Options.ProbeTimeout)
// instead of the adaptive one: the retry of a probe that found no router
// of any pool, before the decision goes best effort (under CPU pressure
// the adaptive deadline is what ran out).
func (p *Pool) ProbeAgain(ctx context.Context, pr Prompt) (routing.Selection, error) {
	return p.probe(ctx, pr, true)
}

func (p *Pool) probe(ctx context.Context, pr Prompt, longest bool) (routing.Selection, error) {
	c, err := p.pick("")
	if err != nil {
		return routing.Selection{}, fmt.Errorf("pool %q: %w", p.cfg.Name, err)
	}
	timeout := c.lat.deadline(p.minTimeout, p.timeout)
	if longest {
		timeout = p.timeout
	}
	t0 := time.Now()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	sel, err := c.r.Probe(pctx, pr)
	cancel()
	took := time.Since(t0)
	if err != nil {
		pe := &ProbeError{Pool: p.cfg.Name, Router: c.addr, Err: err}
		switch {
		case ctx.Err() != nil:
			c.circuit.release()
		case requestFault(err):
			// The router answered: it is up; this request is at fault.
			pe.Request = true
			c.circuit.success()
		case timedOut(err):
			pe.Timeout = true
			c.lat.observe(took)
			if took-timeout > timeout/2 {
				// The deadline fired far later than set: this process was
				// not scheduled, the router may well have answered in time.
				pe.Local = true
				c.circuit.release()
				break
			}
			pe.Backoff = c.circuit.failure(outcomeTimeout)
		default:
			pe.Backoff = c.circuit.failure(outcomeFailure)
		}
		if pe.Backoff > 0 {
			p.log.Warn("local router probe failed; circuit opened", "router", c.addr, "backoff", pe.Backoff, "err", err)
		}
		return routing.Selection{}, pe
	}
	c.lat.observe(took)
	c.circuit.success()
	p.answered()
	sel.Router = c.addr
	if sel.Address == "" {
		// The worker is leaving (its etcd key is gone, the router has not
		// dropped it yet): routing there would send Envoy nowhere.
		return routing.Selection{}, &ProbeError{Pool: p.cfg.Name, Router: c.addr,
			Err: fmt.Errorf("worker %s/%d has no address (leaving the pool)", sel.WorkerID, sel.DPRank)}
	}
	p.known.add(sel.WorkerID, sel.DPRank, sel.Address, time.Now())
	p.refreshKnown(c, pr)
	if p.ej.Ejected(sel.Address) {
		return p.alternative(ctx, c, pr, sel, timeout)
	}
	return sel, nil
}

// alternative replaces sel, whose worker is ejected, with the router's
// best worker that is not (most cached blocks, then least potential load).
func (p *Pool) alternative(ctx context.Context, c *conn, pr Prompt, sel routing.Selection, timeout time.Duration) (routing.Selection, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	loads, err := c.r.Loads(pctx, pr)
	cancel()
	if err != nil {
		return routing.Selection{}, &ProbeError{Pool: p.cfg.Name, Router: c.addr, Timeout: timedOut(err),
			Err: fmt.Errorf("worker %s is ejected; asking for another: %w", sel.WorkerID, err)}
	}
	best, found := routing.Selection{}, false
	now := time.Now()
	for _, l := range loads {
		p.known.add(l.WorkerID, l.DPRank, l.Address, now)
		if l.Address == "" || p.ej.Ejected(l.Address) || !routing.AddressAllowed(pr.Allowed, l.Address) {
			continue // the replacement stays inside the request's subset
		}
		if !found || better(l, best) {
			best, found = l, true
		}
	}
	if !found {
		return routing.Selection{}, &ProbeError{Pool: p.cfg.Name, Router: c.addr,
			Err: fmt.Errorf("%w: %d workers", ErrAllEjected, len(loads))}
	}
	best.Router = c.addr
	best.RequestBlocks, best.BlockSize, best.Candidates = sel.RequestBlocks, sel.BlockSize, sel.Candidates
	return best, nil
}

// refreshInterval is how often a pool asks a router for all its workers
// (PotentialLoads, in the background) so the known workers — same-pool
// fallbacks, best-effort targets — are the whole pool, not only the
// probes' winners.
const refreshInterval = 10 * time.Second

// seedKnown learns the pool's workers from one of its routers (in the
// background) when no refresh succeeded yet: a pool that just got its
// routers knows its workers before its first probe succeeds, so a burst
// whose first probes all run past their deadline (a starved process) is
// routed best effort and committed late, not refused for want of a known
// worker.
func (p *Pool) seedKnown() {
	if p.refreshed.Load() != 0 {
		return
	}
	rs := *p.routers.Load()
	if len(rs) == 0 {
		return
	}
	p.refreshKnown(rs[0], Prompt{Tokens: []uint32{0}, BlockSize: p.cfg.BlockSize, ISL: 1})
}

// refreshKnown starts a background refresh of the known workers through
// c when the last one is older than refreshInterval; one at a time, never
// on the request's path.
func (p *Pool) refreshKnown(c *conn, pr Prompt) {
	if time.Since(time.Unix(0, p.refreshed.Load())) < refreshInterval || !p.refreshing.CompareAndSwap(false, true) {
		return
	}
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		p.refreshing.Store(false)
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	pr.Override = nil
	go func() {
		defer p.wg.Done()
		defer p.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(p.life, p.timeout)
		defer cancel()
		loads, err := c.r.Loads(ctx, pr)
		if err != nil {
			return
		}
		now := time.Now()
		for _, l := range loads {
			p.known.add(l.WorkerID, l.DPRank, l.Address, now)
		}
		p.refreshed.Store(now.UnixNano())
	}()
}

// better orders a router's workers for a request: most cached blocks,
// then least potential prefill, then least decode load.
func better(a, b routing.Selection) bool {
	if a.OverlapBlocks != b.OverlapBlocks {
		return a.OverlapBlocks > b.OverlapBlocks
	}
	if a.PrefillTokens != b.PrefillTokens {
		return a.PrefillTokens < b.PrefillTokens
	}
	return a.DecodeBlocks < b.DecodeBlocks
}

// timedOut reports whether err is a deadline that ran out.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
}

// Others returns up to n of the pool's recently seen workers other than
// except and not ejected, as fallbacks: where Envoy may retry within the
// pool when the primary refuses connections.
func (p *Pool) Others(except string, n int) []routing.Selection {
	if n <= 0 {
		return nil
	}
	var out []routing.Selection
	for _, w := range p.known.list(time.Now(), true, func(a string) bool { return a != except && !p.ej.Ejected(a) }) {
		if len(out) == n {
			break
		}
		out = append(out, routing.Selection{WorkerID: w.id, DPRank: w.rank, Address: w.addr, BlockSize: p.cfg.BlockSize})
	}
	return out
}

// LastKnown is the best-effort choice when none of the pool's local
// routers can be reached: one of the workers recently seen, not ejected
// and whose address allow accepts (nil: any), round robin, with no cost
// terms and no router. ok is false when the pool knows none.
func (p *Pool) LastKnown(allow func(addr string) bool) (sel routing.Selection, ok bool) {
	ws := p.known.list(time.Now(), true, func(a string) bool { return !p.ej.Ejected(a) && (allow == nil || allow(a)) })
	if len(ws) == 0 {
		return routing.Selection{}, false
	}
	w := ws[0]
	return routing.Selection{WorkerID: w.id, DPRank: w.rank, Address: w.addr, BlockSize: p.cfg.BlockSize}, true
}

// Ejected reports whether passive health ejected the worker at addr.
func (p *Pool) Ejected(addr string) bool { return p.ej.Ejected(addr) }
