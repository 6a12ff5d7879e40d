package pool

import (
	"time"

	"github.com/kvgate/kvgate/policies"
)

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
