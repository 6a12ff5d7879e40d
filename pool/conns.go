package pool

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Conns holds the clients to local routers, shared by the pools of a global
// router across reloads, with one circuit per router address. Each user
// holds a reference; a client is closed when its last reference goes.
// Safe for concurrent use.
type Conns struct {
	dial Dialer
	opts atomic.Pointer[CircuitOptions]
	now  func() time.Time

	mu     sync.Mutex
	m      map[string]*conn
	closed bool
}

// conn is one local router's client, its circuit and its references.
type conn struct {
	addr    string
	r       Client
	circuit *circuit
	lat     latency // probe latencies: the adaptive deadline
	refs    int     // guarded by Conns.mu
	// closed: the client's Close has been called or claimed, by the last
	// release or by Conns.Close, whichever came first (guarded by
	// Conns.mu), so it is closed exactly once.
	closed bool
}

// NewConns returns an empty set of clients made with dial. now (nil:
// time.Now) is the circuits' clock.
func NewConns(dial Dialer, opts CircuitOptions, now func() time.Time) *Conns {
	opts.defaults()
	if now == nil {
		now = time.Now
	}
	cs := &Conns{dial: dial, now: now, m: make(map[string]*conn)}
	cs.opts.Store(&opts)
	return cs
}

// SetCircuitOptions changes the backoff of every circuit from their next
// failure on (a configuration reload).
func (cs *Conns) SetCircuitOptions(opts CircuitOptions) {
	opts.defaults()
	cs.opts.Store(&opts)
}

func (cs *Conns) acquire(addr string) (*conn, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil, ErrClosed
	}
	if c, ok := cs.m[addr]; ok {
		c.refs++
		return c, nil
	}
	r, err := cs.dial(addr)
	if err != nil {
		return nil, err
	}
	c := &conn{addr: addr, r: r, refs: 1, circuit: &circuit{opts: &cs.opts, now: cs.now}}
	cs.m[addr] = c
	return c, nil
}

// ref takes one more reference on c, which must be held.
func (cs *Conns) ref(c *conn) {
	cs.mu.Lock()
	c.refs++
	cs.mu.Unlock()
}

func (cs *Conns) release(c *conn) {
	cs.mu.Lock()
	c.refs--
	last := c.refs == 0 && !c.closed // Conns.Close may have claimed it
	if last {
		c.closed = true
		if cs.m[c.addr] == c { // the address may already name a newer conn
			delete(cs.m, c.addr)
		}
	}
	cs.mu.Unlock()
	if last {
		_ = c.r.Close()
	}
}

// Len is the number of open clients.
func (cs *Conns) Len() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.m)
}

// Close closes every client, referenced or not; later acquisitions fail.
func (cs *Conns) Close() error {
	cs.mu.Lock()
	all := make([]*conn, 0, len(cs.m))
	for _, c := range cs.m {
		if !c.closed { // a last release between may have claimed it
			c.closed = true
			all = append(all, c)
		}
	}
	cs.m, cs.closed = map[string]*conn{}, true
	cs.mu.Unlock()
	var first error
	for _, c := range all {
		if err := c.r.Close(); err != nil && first == nil {
			first = fmt.Errorf("close local router %s: %w", c.addr, err)
		}
	}
	return first
}
