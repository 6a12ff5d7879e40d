package pool

import (
	"sync"
	"sync/atomic"
	"time"
)

// CircuitOptions configure the circuit of each local router. A circuit
// opens on evidence of failure, never on one slow probe: Failures hard
// failures in a row (refused connection, reset, unavailable), Timeouts
// probes in a row that ran past their deadline (a slow answer is weaker
// evidence: under CPU pressure it is often the caller that was slow), or a
// failure ratio of at least Ratio over a window of Window once MinCalls
// calls were made in it. An open circuit skips the router for a backoff
// that starts at Base; then one trial call is let through (half-open):
// its success closes the circuit, its failure reopens it with the backoff
// doubled, up to Max. The backoff is doubled at most once per open period,
// however many calls that were in flight fail meanwhile.
type CircuitOptions struct {
	Base time.Duration
	Max  time.Duration
	// Failures is the number of consecutive hard failures that open the
	// circuit (default 3).
	Failures int
	// Timeouts is the number of consecutive deadline-exceeded calls that
	// open the circuit (default 10).
	Timeouts int
	// Ratio, Window and MinCalls: the circuit opens when at least Ratio of
	// the calls of the current Window failed (hard failures and timeouts),
	// once MinCalls calls were made in it (defaults 0.5, 10 s, 20).
	Ratio    float64
	Window   time.Duration
	MinCalls int
}

// Circuit defaults.
const (
	DefaultBackoffBase     = 100 * time.Millisecond
	DefaultBackoffMax      = 10 * time.Second
	DefaultCircuitFailures = 3
	DefaultCircuitTimeouts = 10
	DefaultCircuitRatio    = 0.5
	DefaultCircuitWindow   = 10 * time.Second
	DefaultCircuitMinCalls = 20
)

func (o *CircuitOptions) defaults() {
	if o.Base <= 0 {
		o.Base = DefaultBackoffBase
	}
	if o.Max < o.Base {
		o.Max = max(DefaultBackoffMax, o.Base)
	}
	if o.Failures <= 0 {
		o.Failures = DefaultCircuitFailures
	}
	if o.Timeouts <= 0 {
		o.Timeouts = DefaultCircuitTimeouts
	}
	if !(o.Ratio > 0) || o.Ratio > 1 {
		o.Ratio = DefaultCircuitRatio
	}
	if o.Window <= 0 {
		o.Window = DefaultCircuitWindow
	}
	if o.MinCalls <= 0 {
		o.MinCalls = DefaultCircuitMinCalls
	}
}

// CircuitState is a circuit's state.
type CircuitState int

// Circuit states.
const (
	// CircuitClosed: the router is probed.
	CircuitClosed CircuitState = iota
	// CircuitOpen: the router failed and is skipped until its backoff ends.
	CircuitOpen
	// CircuitHalfOpen: the backoff ended; one probe is in flight to test it.
	CircuitHalfOpen
)

func (s CircuitState) String() string {
	switch s {
	case CircuitOpen:
		return "open"
	case CircuitHalfOpen:
		return "half-open"
	}
	return "closed"
}

// outcome is how a call through a circuit went.
type outcome int

const (
	// outcomeFailure: the router failed (unreachable, reset, unavailable).
	outcomeFailure outcome = iota
	// outcomeTimeout: the call ran past its deadline.
	outcomeTimeout
)

type circuit struct {
	opts *atomic.Pointer[CircuitOptions] // shared by the Conns' circuits
	now  func() time.Time

	mu        sync.Mutex
	state     CircuitState
	failures  int // consecutive hard failures
	timeouts  int // consecutive timeouts
	backoff   time.Duration
	openUntil time.Time
	trial     bool // half-open: the trial probe is in flight
	answered  bool // the router answered a call at least once
	// The ratio window (tumbling).
	winStart     time.Time
	calls, fails int
}

// allow reports whether a call may go to the router now, and moves an
// expired open circuit to half-open, letting exactly one trial through.
func (c *circuit) allow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case CircuitClosed:
		return true
	case CircuitOpen:
		if c.now().Before(c.openUntil) {
			return false
		}
		c.state, c.trial = CircuitHalfOpen, true
		return true
	default: // CircuitHalfOpen
		if c.trial {
			return false
		}
		c.trial = true
		return true
	}
}

// available reports, without changing anything, whether allow could
// succeed.
func (c *circuit) available() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case CircuitOpen:
		return !c.now().Before(c.openUntil)
	case CircuitHalfOpen:
		return !c.trial
	}
	return true
}

// everAnswered reports whether the router answered any call yet.
func (c *circuit) everAnswered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answered
}

// success records a call the router answered. It closes a half-open
// circuit; a late answer to a call made before the circuit opened leaves
// an open one open (its backoff runs its course).
func (c *circuit) success() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.window()
	c.calls++
	c.answered = true
	switch c.state {
	case CircuitOpen:
		return
	case CircuitHalfOpen:
		c.backoff = 0
	}
	c.state, c.failures, c.timeouts, c.trial = CircuitClosed, 0, 0, false
}

// failure records a failed call; it returns the backoff when this call
// opened the circuit, 0 when the circuit stays as it was (closed below its
// thresholds, or already open: concurrent failures of one open period
// double nothing).
func (c *circuit) failure(kind outcome) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.opts.Load()
	c.window()
	c.calls++
	c.fails++
	switch c.state {
	case CircuitOpen:
		return 0
	case CircuitHalfOpen:
		// The trial (or a call that bypassed the circuit while half-open)
		// failed: the router is still down.
		c.backoff = min(2*max(c.backoff, o.Base/2), o.Max)
		c.open()
		return c.backoff
	}
	if kind == outcomeTimeout {
		c.timeouts++
	} else {
		c.failures++
	}
	if c.failures < o.Failures && c.timeouts < o.Timeouts &&
		(c.calls < o.MinCalls || float64(c.fails) < o.Ratio*float64(c.calls)) {
		return 0
	}
	c.backoff = o.Base
	c.open()
	return c.backoff
}

// open opens the circuit for the current backoff; c.mu is held.
func (c *circuit) open() {
	c.state, c.trial = CircuitOpen, false
	c.openUntil = c.now().Add(c.backoff)
	c.winStart, c.calls, c.fails = c.now(), 0, 0
}

// window starts a new ratio window when the current one is over; c.mu is
// held.
func (c *circuit) window() {
	now := c.now()
	if now.Sub(c.winStart) >= c.opts.Load().Window {
		c.winStart, c.calls, c.fails = now, 0, 0
	}
}

// release gives back an allowed call that was not made, or whose outcome
// says nothing of the router (the caller's context ended first, or the
// caller itself was too slow to read the answer): a half-open trial may be
// retried.
func (c *circuit) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == CircuitHalfOpen {
		c.trial = false
	}
}

func (c *circuit) snapshot() (CircuitState, int, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state
	if s == CircuitOpen && !c.now().Before(c.openUntil) {
		s = CircuitHalfOpen
	}
	return s, c.failures + c.timeouts, c.openUntil
}
