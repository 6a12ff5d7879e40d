package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
	"github.com/kvgate/kvgate/policies"
)

// Options are a Pool's dependencies.
type Options struct {
	// Conns holds the clients (required; shared by the pools).
	Conns *Conns
	// ProbeTimeout is the longest a probe may take (default 250 ms);
	// ProbeMinTimeout the shortest deadline it is given (default 25 ms,
	// at most ProbeTimeout). Between the two the deadline adapts to the
	// router's observed probe latency (DeadlineFactor × its p99); equal
	// bounds make it fixed.
	ProbeTimeout    time.Duration
	ProbeMinTimeout time.Duration
	// Ejector is the passive health of the workers (nil: none; shared by
	// the pools of a global router).
	Ejector *Ejector
	// Etcd is required by pools that discover their local routers.
	Etcd   *clientv3.Client
	Logger *slog.Logger
}

// Pool is one pool's clients: probes, commits and health. Safe for
// concurrent use.
type Pool struct {
	cfg        Config
	conns      *Conns
	timeout    time.Duration
	minTimeout time.Duration
	ej         *Ejector
	log        *slog.Logger
	known      known

	routers atomic.Pointer[[]*conn] // immutable snapshot
	next    atomic.Uint32           // round robin over routers

	mu      sync.Mutex // guards the routers' references against Close
	closed  bool
	closing bool // Close began: no more background work
	stop    context.CancelFunc
	wg      sync.WaitGroup
	// life ends at Close: background refreshes of the known workers.
	life       context.Context
	endLife    context.CancelFunc
	refreshing atomic.Bool
	refreshed  atomic.Int64 // unix nanos of the last refresh
	synced     chan struct{}
	disc       map[string][]byte // etcd key → value, owned by the sink
}

// Open returns the pool of cfg (validated by the caller). Static routers are
// taken at once; with etcd discovery a goroutine follows
// membership.RoutersPrefix(cfg.Name) until Close.
func Open(cfg Config, opts Options) (*Pool, error) {
	if opts.Conns == nil {
		return nil, errors.New("pool: Options.Conns is required")
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = DefaultProbeTimeout
	}
	if opts.ProbeMinTimeout <= 0 {
		opts.ProbeMinTimeout = DefaultProbeMinTimeout
	}
	opts.ProbeMinTimeout = min(opts.ProbeMinTimeout, opts.ProbeTimeout)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &Pool{cfg: cfg, conns: opts.Conns, timeout: opts.ProbeTimeout, minTimeout: opts.ProbeMinTimeout, ej: opts.Ejector, synced: make(chan struct{}),
		log: opts.Logger.With("component", "pool", "pool", cfg.Name)}
	empty := []*conn{}
	p.routers.Store(&empty)
	p.life, p.endLife = context.WithCancel(context.Background())
	if !cfg.Routers.Etcd {
		cs := make([]*conn, 0, len(cfg.Routers.Static))
		for _, a := range cfg.Routers.Static {
			c, err := p.conns.acquire(a)
			if err != nil {
				for _, c := range cs {
					p.conns.release(c)
				}
				return nil, fmt.Errorf("pool %q: %w", cfg.Name, err)
			}
			cs = append(cs, c)
		}
		p.routers.Store(&cs)
		close(p.synced)
		return p, nil
	}
	if opts.Etcd == nil {
		return nil, fmt.Errorf("pool %q: routers.etcd is set but no etcd client was given", cfg.Name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := registry.WatchPrefix(ctx, opts.Etcd, membership.RoutersPrefix(cfg.Name), (*sink)(p), p.log); err != nil {
			p.log.Error("local router discovery stopped", "err", err)
		}
	}()
	return p, nil
}

// Config returns the pool's configuration.
func (p *Pool) Config() Config { return p.cfg }

// Name is the pool's name.
func (p *Pool) Name() string { return p.cfg.Name }

// Synced is closed once the pool knows its routers (at once for static
// routers; after the first etcd listing otherwise).
func (p *Pool) Synced() <-chan struct{} { return p.synced }

// Close stops discovery and releases the pool's clients (Trackers keep
// theirs until freed).
func (p *Pool) Close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	if p.stop != nil {
		p.stop()
	}
	p.endLife()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	empty := []*conn{}
	for _, c := range *p.routers.Swap(&empty) {
		p.conns.release(c)
	}
}

// pick returns a router whose circuit lets a call through, preferring
// prefer (an address), else round robin.
func (p *Pool) pick(prefer string) (*conn, error) {
	rs := *p.routers.Load()
	if len(rs) == 0 {
		return nil, ErrNoRouters
	}
	if prefer != "" {
		for _, c := range rs {
			if c.addr == prefer && c.circuit.allow() {
				return c, nil
			}
		}
	}
	start := int(p.next.Add(1))
	for i := range rs {
		c := rs[(start+i)%len(rs)]
		if c.circuit.allow() {
			return c, nil
		}
	}
	return nil, ErrCircuitOpen
}

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
	c, err := p.pick("")
	if err != nil {
		return routing.Selection{}, fmt.Errorf("pool %q: %w", p.cfg.Name, err)
	}
	timeout := c.lat.deadline(p.minTimeout, p.timeout)
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

// requestFault reports whether a router's answer blames the request, not
// the router (a malformed or oversized prompt): no reason to stop probing
// that router for everyone else.
func requestFault(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.OutOfRange, codes.FailedPrecondition:
		return true
	}
	return false
}

// CommitAsync commits a request on the pool, through the router at
// routerAddr when it is still there (the one that answered the probe), and
// returns its lifecycle stream once the commit is sent, without waiting
// for the router's answer: committed (nil: nobody listens) is called once,
// from another goroutine, with the answer (see Client.CommitAsync). The
// Tracker must be freed, a refused commit's too. An error means nothing
// was committed.
func (p *Pool) CommitAsync(ctx context.Context, routerAddr string, cm Commit, committed func(routing.Selection, error)) (Tracker, error) {
	c, picked, err := p.pickForCommit(routerAddr)
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", p.cfg.Name, err)
	}
	p.conns.ref(c)
	t, err := c.r.CommitAsync(ctx, cm, func(sel routing.Selection, err error) {
		if committed == nil {
			return
		}
		if err != nil {
			err = fmt.Errorf("pool %q: commit on %s: %w", p.cfg.Name, c.addr, err)
		} else {
			sel.Router = c.addr
		}
		committed(sel, err)
	})
	if err != nil {
		if picked { // the call went through the circuit: report how it went
			switch {
			case ctx.Err() != nil:
				c.circuit.release()
			case timedOut(err):
				c.circuit.failure(outcomeTimeout)
			default:
				c.circuit.failure(outcomeFailure)
			}
		}
		p.conns.release(c)
		return nil, fmt.Errorf("pool %q: commit on %s: %w", p.cfg.Name, c.addr, err)
	}
	if picked {
		c.circuit.success()
	}
	return &tracker{Tracker: t, release: func() { p.conns.release(c) }}, nil
}

// Commit is CommitAsync waiting, within ctx, for the router's answer: it
// returns the worker's selection, or the refusal (nothing is then left
// open). The stream still outlives ctx, until the Tracker is freed.
func (p *Pool) Commit(ctx context.Context, routerAddr string, cm Commit) (Tracker, routing.Selection, error) {
	type answer struct {
		sel routing.Selection
		err error
	}
	ch := make(chan answer, 1)
	t, err := p.CommitAsync(ctx, routerAddr, cm, func(sel routing.Selection, err error) { ch <- answer{sel, err} })
	if err != nil {
		return nil, routing.Selection{}, err
	}
	select {
	case a := <-ch:
		if a.err != nil {
			_ = t.Free(ctx) // the stream has ended: releases the client
			return nil, routing.Selection{}, a.err
		}
		return t, a.sel, nil
	case <-ctx.Done():
		_ = t.Free(ctx) // closes the stream, which frees the request
		return nil, routing.Selection{}, ctx.Err()
	}
}

// ErrOutOfBounds: a decide-and-commit's router chose a worker the request
// may not use (ejected by passive health, outside its subset, or leaving
// the pool): a router older than the commit's bounds on the wire.
var ErrOutOfBounds = errors.New("the router chose a worker outside the request's bounds")

// Decide is a decide-and-commit: it commits cm with no worker named on the
// pool, through the router at routerAddr when it is still there (the one
// that answered the probe), which chooses the worker as its probe would —
// within cm.Prompt.Allowed, with cm.Prompt.Override, never a worker
// passive health ejected (sent as cm.Exclude) — and records the request
// there in the same step, so no other decision can come between the
// choice and the record. Decide waits for the answer within ctx and the
// router's probe deadline, and returns the lifecycle stream and the chosen
// worker (Router set).
//
// Errors: nothing sent, or the router refused (as CommitAsync; a commit
// the router refuses wraps its error, ErrNoAllowedWorker when no worker is
// left); no answer in time (wraps context.DeadlineExceeded while ctx
// lives); an answer outside the bounds (ErrOutOfBounds). The stream is
// then freed, which frees the request had it landed: nothing is left
// open.
func (p *Pool) Decide(ctx context.Context, routerAddr string, cm Commit) (Tracker, routing.Selection, error) {
	cm.WorkerID, cm.DPRank = "", 0
	cm.Exclude = p.ejectedKnown()
	timeout := p.timeout
	for _, c := range *p.routers.Load() {
		if c.addr == routerAddr {
			timeout = c.lat.deadline(p.minTimeout, p.timeout)
			break
		}
	}
	type answer struct {
		sel routing.Selection
		err error
	}
	ch := make(chan answer, 1)
	t, err := p.CommitAsync(ctx, routerAddr, cm, func(sel routing.Selection, err error) { ch <- answer{sel, err} })
	if err != nil {
		return nil, routing.Selection{}, err
	}
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	var a answer
	select {
	case a = <-ch:
	case <-wait.C:
		a.err = fmt.Errorf("pool %q: decide-and-commit: no answer within %v: %w", p.cfg.Name, timeout, context.DeadlineExceeded)
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	if a.err == nil {
		switch {
		case a.sel.Address == "":
			a.err = fmt.Errorf("pool %q: %w: worker %s/%d has no address (leaving the pool)", p.cfg.Name, ErrOutOfBounds, a.sel.WorkerID, a.sel.DPRank)
		case p.ej.Ejected(a.sel.Address):
			a.err = fmt.Errorf("pool %q: %w: worker %s at %s is ejected", p.cfg.Name, ErrOutOfBounds, a.sel.WorkerID, a.sel.Address)
		case !routing.AddressAllowed(cm.Prompt.Allowed, a.sel.Address):
			a.err = fmt.Errorf("pool %q: %w: worker %s at %s is outside the request's subset", p.cfg.Name, ErrOutOfBounds, a.sel.WorkerID, a.sel.Address)
		}
	}
	if a.err != nil {
		// Closes the stream, which frees the request if it landed; the
		// free is sent even when ctx is gone.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
		_ = t.Free(fctx)
		cancel()
		return nil, routing.Selection{}, a.err
	}
	p.known.add(a.sel.WorkerID, a.sel.DPRank, a.sel.Address, time.Now())
	return t, a.sel, nil
}

// ejectedKnown are the addresses of the pool's recently seen workers that
// passive health ejected.
func (p *Pool) ejectedKnown() []string {
	ws := p.known.list(time.Now(), false, p.ej.Ejected)
	if len(ws) == 0 {
		return nil
	}
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.addr
	}
	return out
}

// pickForCommit takes routerAddr when the pool has it, even when its
// circuit is half-open: it just answered. Otherwise (a pinned worker, or
// the prober left discovery) it picks through the circuits, and picked
// says so: the caller must then report the call's outcome to the circuit,
// or a half-open trial taken here would never end.
func (p *Pool) pickForCommit(routerAddr string) (c *conn, picked bool, err error) {
	rs := *p.routers.Load()
	for _, c := range rs {
		if c.addr == routerAddr {
			return c, false, nil
		}
	}
	c, err = p.pick("")
	return c, err == nil, err
}

// tracker releases its client reference once freed.
type tracker struct {
	Tracker
	once    sync.Once
	release func()
}

func (t *tracker) Free(ctx context.Context) error {
	err := t.Tracker.Free(ctx)
	t.once.Do(t.release)
	return err
}

// Health reports how many of the pool's routers are known and not in
// backoff.
func (p *Pool) Health() policies.Health {
	rs := *p.routers.Load()
	h := policies.Health{Routers: len(rs)}
	for _, c := range rs {
		st, _, _ := c.circuit.snapshot()
		if c.circuit.available() {
			h.Available++
		}
		if st == CircuitHalfOpen {
			h.Recovering = true
		}
	}
	return h
}

// RouterStatus is one local router's circuit, for status pages and
// explanations.
type RouterStatus struct {
	Address   string
	State     CircuitState
	Failures  int
	OpenUntil time.Time
	// Answered: the router answered at least one call (a closed circuit
	// that never did is not known to be reachable).
	Answered bool
}

// Routers reports the pool's routers and their circuits.
func (p *Pool) Routers() []RouterStatus {
	rs := *p.routers.Load()
	out := make([]RouterStatus, len(rs))
	for i, c := range rs {
		st, f, until := c.circuit.snapshot()
		out[i] = RouterStatus{Address: c.addr, State: st, Failures: f, OpenUntil: until, Answered: c.circuit.everAnswered()}
	}
	return out
}

// sink follows the pool's routers in etcd (registry.Sink). Its calls
// come from the watch goroutine, one at a time; disc is theirs alone.
type sink Pool

func (s *sink) Reset(kvs map[string][]byte) {
	p := (*Pool)(s)
	p.disc = make(map[string][]byte, len(kvs))
	for k, v := range kvs {
		p.disc[k] = v
	}
	p.rediscover()
	select {
	case <-p.synced:
	default:
		close(p.synced)
	}
}

func (s *sink) Put(key string, value []byte) {
	p := (*Pool)(s)
	p.disc[key] = value
	p.rediscover()
}

func (s *sink) Delete(key string) {
	p := (*Pool)(s)
	delete(p.disc, key)
	p.rediscover()
}

func (p *Pool) rediscover() {
	addrs := make(map[string]bool, len(p.disc))
	for k, v := range p.disc {
		if a, ok := p.routerAddr(k, v); ok {
			addrs[a] = true
		}
	}
	p.setRouters(addrs)
}

func (p *Pool) routerAddr(key string, value []byte) (string, bool) {
	info, err := membership.ParseRouterInfo(value)
	if err != nil {
		p.log.Warn("ignoring local router registration", "key", key, "err", err)
		return "", false
	}
	if info.BlockSize != p.cfg.BlockSize {
		p.log.Warn("ignoring local router with another block size", "key", key, "router_block_size", info.BlockSize, "pool_block_size", p.cfg.BlockSize)
		return "", false
	}
	return info.GRPCAddress, true
}

// setRouters makes addrs the pool's routers, taking references on new ones
// and releasing the ones gone.
func (p *Pool) setRouters(addrs map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	old := *p.routers.Load()
	keep := make([]*conn, 0, len(addrs))
	have := map[string]bool{}
	for _, c := range old {
		if addrs[c.addr] {
			keep = append(keep, c)
			have[c.addr] = true
		} else {
			p.conns.release(c)
		}
	}
	for a := range addrs {
		if have[a] {
			continue
		}
		c, err := p.conns.acquire(a)
		if err != nil {
			p.log.Warn("cannot connect to discovered local router", "router", a, "err", err)
			continue
		}
		keep = append(keep, c)
	}
	p.routers.Store(&keep)
	p.log.Info("local routers", "routers", strings.Join(addrsOf(keep), ","))
}

func addrsOf(cs []*conn) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.addr
	}
	return out
}
