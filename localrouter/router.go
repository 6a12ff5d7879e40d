package localrouter

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// Errors of Router methods (api/routing's sentinels). The gRPC service maps
// them to status codes.
var (
	ErrClosed         = routing.ErrClosed
	ErrNoWorkers      = routing.ErrNoWorkers
	ErrNotReady       = routing.ErrNotReady
	ErrUnknownWorker  = routing.ErrUnknownWorker
	ErrEmptyRequest   = routing.ErrEmptyRequest
	ErrUnknownRequest = routing.ErrUnknownRequest
	// ErrNoAllowedWorker: BestWorkerOptions.Allow admitted none of the
	// pool's workers (an endpoint subset that names none of them).
	ErrNoAllowedWorker = routing.ErrNoAllowedWorker
)

// Options are a Router's dependencies; zero values take defaults.
type Options struct {
	// Clock returns the current time (default time.Now).
	Clock func() time.Time
	// Rand breaks ties and samples at temperature > 0 (default: a random
	// source). Tests inject a seeded one.
	Rand *rand.Rand
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// SweepInterval is how often expired requests and approximate entries
	// are dropped (default 1 s; negative disables the sweeper, e.g. for
	// simulations that call Sweep themselves).
	SweepInterval time.Duration
}

// Router is one pool's KV-aware router: the KV index, the lifecycle state of
// requests in flight, the pool's membership and the cost function.
//
// Concurrency: safe for concurrent use. The per-request path (BestWorker,
// PotentialLoads) reads the membership snapshot through an atomic pointer,
// the index under its read lock, and the lifecycle state under its mutex.
// Lock order: applyMu, then memMu, then Index.mu or ActiveSequences.mu;
// the last two are never held together. placeMu (placing decisions) is
// taken before the Index's and ActiveSequences' locks, never with applyMu
// or memMu.
type Router struct {
	cfg     Config
	chain   *workerChain // built once from cfg.WorkerChain
	index   *Index
	active  *ActiveSequences
	res     *reservations // guarded by placeMu (reserve.go)
	members atomic.Pointer[members]
	memMu   sync.Mutex // serialises membership writers
	// applyMu makes "is the worker a member? then apply its event" atomic
	// with respect to RemoveWorker: appliers share it, removal takes it
	// alone, so no event of a removed worker lands after its removal.
	// Lock order: applyMu, then memMu, then the Index's and
	// ActiveSequences' own locks.
	applyMu sync.RWMutex
	// placeMu serialises placing decisions (BestWorker with a request id,
	// Commit): each sees every placement before it, so a burst of
	// decide-and-commit calls cannot all choose from the same state. Pure
	// probes never take it. Lock order: placeMu first, before the Index's
	// and ActiveSequences' locks (never with applyMu or memMu).
	placeMu sync.Mutex

	clock  func() time.Time
	randMu sync.Mutex
	rnd    *rand.Rand
	log    *slog.Logger

	scratch sync.Pool

	// sig holds the engine signals of the ranks whose metrics are scraped
	// (SetEngineSignals), an immutable map replaced whole. sigMu
	// serialises its writers and is a leaf: nothing else is locked while
	// it is held.
	sig   atomic.Pointer[map[WorkerKey]signals.Sample]
	sigMu sync.Mutex

	// stale holds the workers marked stale (SetWorkerStale): their
	// events cannot reach the router. An immutable set replaced whole
	// under staleMu, a leaf lock.
	stale   atomic.Pointer[map[string]bool]
	staleMu sync.Mutex

	unknownWorkerEvents atomic.Uint64
	saturationSkips     atomic.Uint64
	closed              atomic.Bool
	stop                chan struct{}
	done                chan struct{}

	// overrideNoted: OverrideNote was logged (once per router);
	// sessionNoted: SessionNote was.
	overrideNoted, sessionNoted atomic.Bool
}

type scratch struct {
	local, seq []uint64
	matches    Matches
	loads      []PotentialLoad
	overlaps   []int
	costs      []float64
	// confirmed: each candidate's overlap held for real, not predicted
	// (filled only while predicted entries exist).
	confirmed []int
	// allowed holds the workers (and their slots) Allow admitted.
	allowed      []WorkerKey
	allowedSlots []int32
	// fresh holds the candidates that are not stale.
	fresh      []WorkerKey
	freshSlots []int32
	// overlapEq: each candidate's overlap in GPU-block equivalents.
	overlapEq []float64
	// indexed: each candidate's overlap in the index alone, before the
	// in-flight blocks were credited (creditReserved); reserved: the
	// request's leading blocks active on each candidate.
	indexed, reserved []int
	chain             chainScratch
}

// New returns a Router. Close it to stop its sweeper; closing one Router
// never affects another.
func New(cfg Config, opts Options) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	chain, err := buildChain(cfg.WorkerChain, cfg)
	if err != nil {
		return nil, err
	}
	if chain.credit != nil {
		cfg.OverlapScoreCredit = *chain.credit
	}
	if chain.scale != nil {
		cfg.PrefillLoadScale = *chain.scale
	}
	ix, err := NewIndex(cfg.BlockSize, IndexOptions{TTL: cfg.TTL, MaxApproxEntries: cfg.MaxTreeSize, PredictedTTL: cfg.PredictedTTL})
	if err != nil {
		return nil, err
	}
	r := &Router{
		cfg:    cfg,
		chain:  chain,
		index:  ix,
		active: NewActiveSequences(),
		res:    newReservations(),
		clock:  opts.Clock,
		rnd:    opts.Rand,
		log:    opts.Logger,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if r.clock == nil {
		r.clock = time.Now
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.log = r.log.With("component", "localrouter")
	r.members.Store(&members{dp: map[string]int{}})
	r.sig.Store(&map[WorkerKey]signals.Sample{})
	r.stale.Store(&map[string]bool{})
	r.scratch.New = func() any { return &scratch{} }
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Second
	}
	if opts.SweepInterval > 0 {
		go r.sweeper(opts.SweepInterval)
	} else {
		close(r.done)
	}
	return r, nil
}

func (r *Router) sweeper(every time.Duration) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.Sweep()
		}
	}
}

// Sweep frees requests older than the request expiry and drops expired
// approximate-mode and predicted entries. It returns the ids of the freed requests.
func (r *Router) Sweep() []string {
	now := r.clock()
	r.index.Expire(now)
	r.expireReservations(now)
	ids := r.active.Expire(now, r.cfg.RequestExpiry)
	r.chain.timing.cal.expire(now.Add(-r.cfg.RequestExpiry))
	if len(ids) > 0 {
		r.log.Warn("freed requests past their expiry", "count", len(ids), "expiry", r.cfg.RequestExpiry)
	}
	return ids
}

// Close stops the router's sweeper. Later calls fail with ErrClosed.
func (r *Router) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	close(r.stop)
	<-r.done
	return nil
}

// Config returns the router's configuration.
func (r *Router) Config() Config { return r.cfg }

// Index returns the router's KV index.
func (r *Router) Index() *Index { return r.index }

// Active returns the router's lifecycle state.
func (r *Router) Active() *ActiveSequences { return r.active }

// Selected is the worker key of a selection.
func Selected(s routing.Selection) WorkerKey { return routing.Selected(s) }

// DumpEvents returns the index as events (see Index.Dump).
func (r *Router) DumpEvents(ctx context.Context) ([]kvevents.RouterEvent, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return r.index.Dump(), nil
}
