package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/pool"
)

// The Gateway API Inference Extension's endpoint-picker protocol (v1.0.0,
// kubernetes-sigs/gateway-api-inference-extension
// docs/proposals/004-endpoint-picker-protocol) as the global router meets
// it: the endpoint subset a gateway names (Request.Subset) bounds every
// endpoint a decision names, and the endpoint that served the request
// (reported on the response) takes over the request's lifecycle
// (Mover). The wire forms (metadata_context, headers) are extproc's.

// ErrNoEndpointInSubset (503): the request named an endpoint subset and
// none of its endpoints is eligible (the list is empty, or no pool has a
// worker at those addresses that can take the request).
var ErrNoEndpointInSubset = errors.New("no endpoint in the subset")

// Subset is the set of endpoints a request may be sent to, as an Inference
// Extension gateway names it (envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset). A nil *Subset allows every
// endpoint; an empty one allows none.
type Subset struct {
	// Addresses are ip:port entries; an entry without a port allows every
	// endpoint on that host.
	Addresses []string
}

// allows reports whether addr (host:port) is in the subset. A nil Subset
// allows everything; an empty address never.
func (s *Subset) allows(addr string) bool {
	if s == nil {
		return true
	}
	return addr != "" && len(s.Addresses) > 0 && routing.AddressAllowed(s.Addresses, addr)
}

// addresses is what a probe sends as allowed_addresses (nil: no subset).
func (s *Subset) addresses() []string {
	if s == nil {
		return nil
	}
	return s.Addresses
}

// errSubsetMiss marks a pool (or a pinned worker) that has no endpoint in
// the request's subset.
var errSubsetMiss = fmt.Errorf("%w: the pool has no eligible worker in it", ErrNoEndpointInSubset)

// filterSubset turns every probe result whose worker is outside the
// request's subset into a subset miss: the local router answers
// NO_ALLOWED_WORKER itself, and an older one that ignores
// allowed_addresses is caught here by the address it chose. It returns how
// many results are misses.
func filterSubset(s *Subset, results []probeResult) (misses int) {
	for i := range results {
		res := &results[i]
		switch {
		case res.err != nil && errors.Is(res.err, routing.ErrNoAllowedWorker):
			res.err = fmt.Errorf("pool %q: %w: %w", res.pe.cfg.Name, errSubsetMiss, res.err)
		case res.err == nil && s != nil && !s.allows(res.sel.Address):
			res.err = fmt.Errorf("pool %q: worker %s at %s: %w", res.pe.cfg.Name, res.sel.WorkerID, res.sel.Address, errSubsetMiss)
		default:
			continue
		}
		misses++
	}
	return misses
}

// subsetMissOnly reports whether errs is not empty and each is a subset
// miss.
func subsetMissOnly(errs []error) bool {
	for _, err := range errs {
		if !errors.Is(err, ErrNoEndpointInSubset) {
			return false
		}
	}
	return len(errs) > 0
}

// Mover is implemented by the Leases of the global router's decisions: the
// data plane may serve a request from a fallback rather than the primary
// (Envoy retried), and reports which one (envoy.lb
// x-gateway-destination-endpoint-served). Move commits the request on the
// local router of to (a fallback of the decision) and frees it on the
// primary's; later PrefillComplete and Free go to to's router, and a
// prefill already marked is marked there too. It is safe for concurrent
// use with the other Lease methods; after Free it does nothing.
type Mover interface {
	Move(ctx context.Context, to Endpoint) error
}

var _ Mover = (*lease)(nil)

// Move implements Mover.
func (l *lease) Move(ctx context.Context, to Endpoint) error {
	m, ok := l.main.(*movable)
	if !ok || m.move == nil {
		return errors.New("the lease cannot move: its decision has no fallbacks")
	}
	if m.retarget != nil && m.retarget(to) {
		return nil // a best-effort commit still queued now names to
	}
	prev := l.mainRefused.Swap(nil) // the primary's refusal is no longer the request's
	tr, err := m.move(ctx, to, &l.mainRefused)
	if err != nil {
		l.mainRefused.CompareAndSwap(nil, prev)
		return fmt.Errorf("move to pool %q worker %q: %w", to.Pool, to.WorkerID, err)
	}
	return m.swap(ctx, tr)
}

// movable is a Tracker whose request can move to another worker's local
// router: the lease's main tracker when the decision has fallbacks.
type movable struct {
	// move commits the request on to's pool; refused receives a refusal
	// of that commit.
	move func(ctx context.Context, to Endpoint, refused *atomic.Pointer[error]) (pool.Tracker, error)
	// retarget (nil: none) moves the request without a commit of its
	// own, when it can: a best-effort decision's late commit still
	// queued is made to name to's worker (accounting.go).
	retarget func(to Endpoint) bool

	mu        sync.Mutex
	cur       pool.Tracker
	prefilled bool
	freed     bool
}

var _ pool.Tracker = (*movable)(nil)

func (m *movable) PrefillComplete(ctx context.Context) error {
	m.mu.Lock()
	m.prefilled = true
	cur := m.cur
	m.mu.Unlock()
	return cur.PrefillComplete(ctx)
}

func (m *movable) Free(ctx context.Context) error {
	m.mu.Lock()
	m.freed = true
	cur := m.cur
	m.mu.Unlock()
	return cur.Free(ctx)
}

// swap makes tr the request's tracker and frees the old one. After Free
// the new tracker is freed at once.
func (m *movable) swap(ctx context.Context, tr pool.Tracker) error {
	m.mu.Lock()
	if m.freed {
		m.mu.Unlock()
		return tr.Free(ctx)
	}
	old, prefilled := m.cur, m.prefilled
	m.cur = tr
	m.mu.Unlock()
	var err error
	if prefilled {
		err = tr.PrefillComplete(ctx)
	}
	return errors.Join(err, old.Free(ctx))
}

// mover returns the function that moves request p to another endpoint:
// a pipelined commit of the same request (id, prompt) on the endpoint's
// worker, through the local router that probed it, in the configuration
// current at the time of the move. A refusal of that commit is kept in
// refused, as the primary's is.
func (r *Router) mover(p *prepared) func(ctx context.Context, to Endpoint, refused *atomic.Pointer[error]) (pool.Tracker, error) {
	return func(ctx context.Context, to Endpoint, refused *atomic.Pointer[error]) (pool.Tracker, error) {
		st := r.acquire()
		if st == nil {
			return nil, errors.New("the global router is closed")
		}
		defer st.release()
		pe := st.byName[to.Pool]
		if pe == nil {
			return nil, fmt.Errorf("pool %q is no longer configured", to.Pool)
		}
		// The moved request has an id of its own: a fallback in the
		// primary's pool is usually on the same local router, which still
		// holds p.id until the primary's tracker is freed and would refuse
		// it as already active (the request then counted nowhere).
		id := p.id + movedSuffix
		return pe.p.CommitAsync(ctx, to.Router, pool.Commit{
			RequestID: id, WorkerID: to.WorkerID, DPRank: to.DPRank, Prompt: p.prompt(pe.cfg.BlockSize),
		}, r.committed(id, to.Pool, to.WorkerID, refused))
	}
}

// movedSuffix marks the id of a request committed again on the worker that
// served it (a request moves at most once).
const movedSuffix = "~served"

// movableTracker wraps a decision's main tracker so the request can move
// to a fallback; decisions without fallbacks keep the tracker as it is.
func (r *Router) movableTracker(p *prepared, tr pool.Tracker, fallbacks int) pool.Tracker {
	if fallbacks == 0 {
		return tr
	}
	return &movable{move: r.mover(p), cur: tr}
}

// Ready reports whether the router can route requests: a configuration is
// loaded and at least one of its pools has a local router that is not in
// backoff. The ext_proc server's readiness health services follow it.
func (r *Router) Ready() bool {
	st := r.acquire()
	if st == nil {
		return false
	}
	defer st.release()
	for _, pe := range st.pools {
		if pe.p.Health().Available > 0 {
			return true
		}
	}
	return false
}
