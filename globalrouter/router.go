package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// syncTimeout bounds how long New and Reload wait for etcd discovery's
// first listing.
const syncTimeout = 5 * time.Second

// Router is the global router: it implements Decider over the configured
// pools. Safe for concurrent use. Decide takes no lock: it reads the
// current configuration (an immutable state) through an atomic pointer and
// holds a reference on it; Reload builds a new state and swaps it in, then
// retires the old one once the last decision using it dropped its
// reference.
type Router struct {
	opts  options
	log   *slog.Logger
	m     *metrics
	conns *pool.Conns
	// ejector is the workers' passive health, shared by every state's
	// pools (its durations are the first configuration's).
	ejector *pool.Ejector

	reloadMu sync.Mutex // serialises Reload and Close
	// recheckMu (a channel of capacity 1: a lock waited for with a
	// bound) serialises the contended decide-and-commits: their second
	// placement and their recheck (commit.go); and the contended
	// reserving decisions: their second probes, up to their confirmation
	// and releases (reserve.go). Uncontended decisions do not take it.
	recheckMu chan struct{}
	// leases counts the decisions returned whose Lease is not freed yet
	// (Leases; accounting.go).
	leases atomic.Int64
	st     atomic.Pointer[state]
	// probers probe a decision's second and later pools (probers.go).
	probers *probers

	// flow are the flow-control queues (flow.go); never nil.
	flow       *flowQueues
	shadowRun  *shadowRunner                // shadow.go
	tracer     trace.Tracer                 // nil: tracing off (tracing.go)
	lastReload atomic.Pointer[ReloadStatus] // observe.go
}

var _ Decider = (*Router)(nil)

// New builds a Router from cfg (defaults applied, validated) and opts. It
// returns once the pools that discover their local routers in etcd have
// their first listing (at most 5 s).
func New(cfg Config, opts ...Option) (*Router, error) {
	o := options{}
	for _, f := range opts {
		f(&o)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.registerer == nil {
		o.registerer = prometheus.NewRegistry()
	}
	if o.dialer == nil {
		o.dialer = pool.ChannelDialer()
	}
	if o.now == nil {
		o.now = time.Now
	}
	o.registry = builtins(o.registry)
	m, err := newMetrics(o.registerer)
	if err != nil {
		return nil, fmt.Errorf("globalrouter: metrics: %w", err)
	}
	sm, err := newShadowMetrics(o.registerer)
	if err != nil {
		return nil, fmt.Errorf("globalrouter: metrics: %w", err)
	}
	cfg.Defaults()
	fm, err := flowcontrol.NewMetrics(o.registerer, cfg.FlowControl.MaxFlowLabels)
	if err != nil {
		return nil, fmt.Errorf("globalrouter: metrics: %w", err)
	}
	if err := applyShadowFile(&cfg, o.shadowFile); err != nil {
		return nil, err
	}
	chain, err := cfg.validate(o.registry)
	if err == nil {
		err = o.subtree.checkLoops(&cfg)
	}
	if err != nil {
		return nil, err
	}
	r := &Router{opts: o, m: m, log: o.logger.With("component", "globalrouter"), recheckMu: make(chan struct{}, 1), shadowRun: &shadowRunner{m: sm},
		flow:    newFlowQueues(fm, o.logger.With("component", "flowcontrol")),
		conns:   pool.NewConns(o.dialer, cfg.Probe.circuit(), o.now),
		ejector: pool.NewEjector(cfg.Probe.EjectBase, cfg.Probe.EjectMax, o.now)}
	st, err := r.build(&cfg, chain, nil)
	if o.tracer != nil {
		r.tracer = o.tracer.Tracer(tracerName)
	}
	if err != nil {
		_ = r.conns.Close()
		return nil, err
	}
	r.probers = newProbers(defaultProbers)
	r.st.Store(st)
	r.noteReload(cfg.File, nil)
	r.log.Info("global router configured", "pools", len(st.pools), "models", len(st.models), "chain", chainNames(st.chain), "file", cfg.File)
	return r, nil
}

// Config returns the current configuration.
func (r *Router) Config() Config {
	st := r.st.Load()
	if st == nil {
		return Config{}
	}
	return *st.cfg
}

// PoolHealth is one pool's health, for status pages.
type PoolHealth struct {
	Pool    string
	Role    policies.Role
	Health  policies.Health
	Routers []pool.RouterStatus
}

// Health reports every pool's health.
func (r *Router) Health() []PoolHealth {
	st := r.acquire()
	if st == nil {
		return nil
	}
	defer st.release()
	out := make([]PoolHealth, len(st.pools))
	for i, pe := range st.pools {
		out[i] = PoolHealth{Pool: pe.cfg.Name, Role: pe.cfg.Role, Health: pe.p.Health(), Routers: pe.p.Routers()}
	}
	return out
}

// Close stops the router: pools, discovery and every local-router client
// (open leases break, which frees their requests on the local routers).
func (r *Router) Close() error {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	if st := r.st.Swap(nil); st != nil {
		st.retire()
	}
	r.flow.close() // waiting requests are refused (queue_closed)
	err := r.conns.Close()
	r.probers.close()
	return err
}

// decideOnce is one decision, observed (Decide runs it, and again for
// each try of a request flow control let wait: its duration, span and
// observation are the try's; kvgate_globalrouter_decisions_total counts
// the request once, in Decide).
func (r *Router) decideOnce(ctx context.Context, req *Request) (*Decision, error) {
	start := r.opts.now()
	ctx, sp := r.startDecide(ctx, req)
	d, err := r.decide(ctx, req)
	outcome := "ok"
	if err != nil {
		outcome = errOutcome(err)
	} else {
		if l, ok := d.Lease.(*lease); ok {
			l.live = &r.leases
			r.leases.Add(1)
			if r.opts.freed != nil {
				l.id, l.onFree = req.GetID(), r.opts.freed
			}
		}
	}
	dur := r.opts.now().Sub(start)
	r.observeDecision(outcome, dur.Seconds(), sp)
	endDecide(sp, d, outcome, err)
	if r.opts.observe != nil {
		o := Observation{Time: start, RequestID: req.GetID(), ClientID: req.clientID(), Model: req.GetModel(), Outcome: outcome, Err: err, Duration: dur, Decision: d}
		if d != nil {
			o.Explanation = d.explained
		}
		r.opts.observe(o)
	}
	return d, err
}

// countDecision counts a request's decision once, whatever the tries
// flow control made (kvgate_flowcontrol_tries_total counts those).
func (r *Router) countDecision(d *Decision, err error) {
	outcome, poolName := "ok", ""
	if err != nil {
		outcome = errOutcome(err)
	} else {
		poolName = d.Primary.Pool
	}
	r.m.decisions.WithLabelValues(poolName, outcome).Inc()
}

// TrustHeader is the header that carries a caller's trust token
// (trust.header): the front door removes it before requests go upstream.
func (r *Router) TrustHeader() string {
	st := r.acquire()
	if st == nil {
		return DefaultTrustHeader
	}
	defer st.release()
	return st.cfg.Trust.Header
}

// HealthReporter takes passive health reports from the response path
// (the ext_proc server). Router implements it. Methods are safe for
// concurrent use and do not block.
type HealthReporter interface {
	// ConnectFailed reports that connecting to the worker at address (a
	// Decision endpoint's, of pool) failed: Envoy's local reply "upstream
	// connect error", or another endpoint of the list served instead. The
	// worker leaves the candidates for a bounded time (probe.eject_base,
	// doubling to probe.eject_max), long before its lease would expire.
	ConnectFailed(pool, address string)
	// Served reports that the worker at address answered: an ejected
	// worker is re-admitted at once.
	Served(pool, address string)
}

var _ HealthReporter = (*Router)(nil)

// ConnectFailed implements HealthReporter.
func (r *Router) ConnectFailed(poolName, address string) {
	if d, ejected := r.ejector.Report(address); ejected {
		r.m.ejections.WithLabelValues(poolName).Inc()
		r.log.Warn("worker connections fail; ejected from the candidates", "pool", poolName, "address", address, "for", d)
	}
}

// Served implements HealthReporter.
func (r *Router) Served(_, address string) { r.ejector.Readmit(address) }

func errOutcome(err error) string {
	switch {
	case errors.Is(err, ErrForbidden):
		return "forbidden"
	case errors.Is(err, ErrBadRequest):
		return "bad_request"
	case errors.Is(err, ErrUnknownModel):
		return "unknown_model"
	case errors.Is(err, ErrBodyTooLarge):
		return "body_too_large"
	case errors.Is(err, ErrPinRefused):
		return "pin_refused"
	case errors.Is(err, ErrSaturated):
		return "saturated"
	case errors.Is(err, ErrNoPool):
		return "no_pool"
	}
	return "error"
}
