package pool

import (
	"sync"
	"sync/atomic"
	"time"
)

// CircuitOptions configure the circuit of each local router: after a
// failure the router is not probed for a backoff that starts at Base and
// doubles with each failure in a row up to Max; then one probe is let
// through (half-open), and its success closes the circuit.
type CircuitOptions struct {
	Base time.Duration
	Max  time.Duration
}

// Circuit defaults.
const (
	DefaultBackoffBase = 100 * time.Millisecond
	DefaultBackoffMax  = 10 * time.Second
)

func (o *CircuitOptions) defaults() {
	if o.Base <= 0 {
		o.Base = DefaultBackoffBase
	}
	if o.Max < o.Base {
		o.Max = max(DefaultBackoffMax, o.Base)
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

type circuit struct {
	opts *atomic.Pointer[CircuitOptions] // shared by the Conns' circuits
	now  func() time.Time

	mu        sync.Mutex
	state     CircuitState
	failures  int
	backoff   time.Duration
	openUntil time.Time
	trial     bool // half-open: the trial probe is in flight
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

func (c *circuit) success() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state, c.failures, c.backoff, c.trial = CircuitClosed, 0, 0, false
}

// failure opens the circuit; it returns the backoff.
func (c *circuit) failure() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	o := c.opts.Load()
	if c.backoff == 0 {
		c.backoff = o.Base
	} else {
		c.backoff = min(2*c.backoff, o.Max)
	}
	c.state, c.trial = CircuitOpen, false
	c.openUntil = c.now().Add(c.backoff)
	return c.backoff
}

// release gives back an allowed call that was not made (the caller's
// context ended first): a half-open trial may be retried.
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
	return s, c.failures, c.openUntil
}
