package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
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
	// LateCommits bounds the pool's queue of late commits (CommitLate:
	// best-effort decisions waiting for a router to answer again); 0:
	// DefaultLateCommits.
	LateCommits int
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
	// late holds the best-effort decisions' commits until a router of
	// the pool answers (late.go). Lock order: late.mu before mu.
	late lateQueue
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
	p.late.max, p.late.wake = opts.LateCommits, make(chan struct{}, 1)
	if p.late.max <= 0 {
		p.late.max = DefaultLateCommits
	}
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
		p.seedKnown()
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
