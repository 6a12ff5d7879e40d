package pool

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Probe deadline defaults. The deadline adapts to the probe latency the
// global router observes: DeadlineFactor times the 99th percentile of the
// last probes to the router, within [DefaultProbeMinTimeout,
// DefaultProbeTimeout]. A fixed 20 ms deadline turned CPU pressure on the
// global router's host into an outage (issue 13): the routers answered in
// under a millisecond, the answers were read late.
const (
	DefaultProbeTimeout    = 250 * time.Millisecond
	DefaultProbeMinTimeout = 25 * time.Millisecond
	DeadlineFactor         = 4
	// latencySamples is how many recent probe latencies a router keeps.
	latencySamples = 128
	// recomputeEvery: the deadline is recomputed after this many samples
	// (sorting on every probe would cost the hot path).
	recomputeEvery = 16
)

// latency keeps a router's recent probe latencies and the deadline they
// give. Safe for concurrent use; deadline takes no lock.
type latency struct {
	mu      sync.Mutex
	samples [latencySamples]time.Duration
	n       int // samples written (ring index = n % latencySamples)
	// p99 is the current 99th percentile (0: no samples yet).
	p99 atomic.Int64
}

// observe records one probe's latency (a probe past its deadline is
// recorded with the time it took, which raises the next deadline).
func (l *latency) observe(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.samples[l.n%latencySamples] = d
	l.n++
	if l.n <= recomputeEvery || l.n%recomputeEvery == 0 {
		k := min(l.n, latencySamples)
		s := make([]time.Duration, k)
		copy(s, l.samples[:k])
		slices.Sort(s)
		l.p99.Store(int64(s[(k*99)/100]))
	}
}

// deadline is the probe deadline: DeadlineFactor × p99, within [lo, hi];
// hi until the router has been probed (nothing is known of it yet).
func (l *latency) deadline(lo, hi time.Duration) time.Duration {
	p := time.Duration(l.p99.Load())
	if p == 0 {
		return hi
	}
	return min(max(DeadlineFactor*p, lo), hi)
}
