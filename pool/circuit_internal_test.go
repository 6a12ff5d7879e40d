package pool

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newCircuit(o CircuitOptions, now func() time.Time) *circuit {
	o.defaults()
	p := &atomic.Pointer[CircuitOptions]{}
	p.Store(&o)
	return &circuit{opts: p, now: now}
}

// TestCircuitRules: a circuit opens on Failures hard failures in a row,
// on Timeouts timeouts in a row, or on the failure ratio of its window;
// never on one failure, and a success in between starts the count again.
func TestCircuitRules(t *testing.T) {
	now := time.Unix(1000, 0)
	clk := func() time.Time { return now }
	o := CircuitOptions{Base: time.Second, Max: 8 * time.Second, Failures: 3, Timeouts: 5, Ratio: 0.5, Window: time.Minute, MinCalls: 10}

	c := newCircuit(o, clk)
	for i := range 2 {
		if b := c.failure(outcomeFailure); b != 0 {
			t.Fatalf("failure %d opened the circuit (backoff %v), want it closed below 3", i+1, b)
		}
	}
	c.success()
	for i := range 2 {
		if b := c.failure(outcomeFailure); b != 0 {
			t.Fatalf("failure %d after a success opened the circuit (backoff %v)", i+1, b)
		}
	}
	if b := c.failure(outcomeFailure); b != time.Second {
		t.Fatalf("third failure in a row: backoff %v, want 1s", b)
	}
	if c.allow() {
		t.Error("open circuit let a call through")
	}

	c = newCircuit(o, clk)
	for i := range 4 {
		if b := c.failure(outcomeTimeout); b != 0 {
			t.Fatalf("timeout %d opened the circuit (backoff %v), want it closed below 5", i+1, b)
		}
	}
	if b := c.failure(outcomeTimeout); b != time.Second {
		t.Fatalf("fifth timeout in a row: backoff %v, want 1s", b)
	}

	// Ratio: alternate failure and success; neither run reaches its
	// threshold, the ratio (1/2 of 10 calls) does.
	c = newCircuit(o, clk)
	opened := 0
	for i := range 10 {
		if i%2 == 0 {
			c.success()
		} else if c.failure(outcomeFailure) > 0 {
			opened = i + 1
		}
	}
	if opened != 10 {
		t.Errorf("ratio: opened at call %d, want 10 (5 failures of 10 calls)", opened)
	}
}

// TestBurstDoublesBackoffOnce: many calls in flight fail together; the
// circuit opens once with the base backoff, the failures that land while
// it is open change nothing, and a failed trial doubles the backoff once
// however many failures arrive with it.
func TestBurstDoublesBackoffOnce(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clk := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	c := newCircuit(CircuitOptions{Base: 100 * time.Millisecond, Max: 10 * time.Second, Failures: 3}, clk)

	burst := func(n int) []time.Duration {
		var wg sync.WaitGroup
		out := make([]time.Duration, n)
		for i := range n {
			wg.Go(func() { out[i] = c.failure(outcomeFailure) })
		}
		wg.Wait()
		return out
	}
	openedWith := func(bs []time.Duration) (n int, b time.Duration) {
		for _, x := range bs {
			if x > 0 {
				n++
				b = x
			}
		}
		return n, b
	}

	if n, b := openedWith(burst(200)); n != 1 || b != 100*time.Millisecond {
		t.Fatalf("burst of 200 failures: %d opened the circuit (last backoff %v), want 1 with 100ms", n, b)
	}
	_, _, until := c.snapshot()
	if want := clk().Add(100 * time.Millisecond); !until.Equal(want) {
		t.Errorf("open until %v, want %v", until, want)
	}

	advance(100 * time.Millisecond)
	if !c.allow() {
		t.Fatal("the backoff ended but no trial was let through")
	}
	if c.allow() {
		t.Fatal("a second trial was let through while half-open")
	}
	// The trial fails along with a burst of late failures.
	if n, b := openedWith(burst(200)); n != 1 || b != 200*time.Millisecond {
		t.Fatalf("failed trial with a burst: %d reopened the circuit (backoff %v), want 1 with 200ms", n, b)
	}
	if st, _, until := c.snapshot(); st != CircuitOpen || !until.Equal(clk().Add(200*time.Millisecond)) {
		t.Errorf("after the failed trial: %v until %v, want open for 200ms", st, until)
	}

	// A late success of a call from before does not close an open circuit;
	// the trial's success does, and the backoff starts over.
	c.success()
	if st, _, _ := c.snapshot(); st != CircuitOpen {
		t.Errorf("a late success closed an open circuit: %v", st)
	}
	advance(200 * time.Millisecond)
	if !c.allow() {
		t.Fatal("no trial after the second backoff")
	}
	c.success()
	if st, _, _ := c.snapshot(); st != CircuitClosed {
		t.Fatalf("after a successful trial: %v, want closed", st)
	}
	burst(3)
	if _, _, until := c.snapshot(); !until.Equal(clk().Add(100 * time.Millisecond)) {
		t.Errorf("reopened after closing: until %v, want the base backoff again", until)
	}
}

func TestAdaptiveDeadline(t *testing.T) {
	var l latency
	lo, hi := 25*time.Millisecond, 250*time.Millisecond
	if d := l.deadline(lo, hi); d != hi {
		t.Errorf("no samples: deadline %v, want the maximum %v", d, hi)
	}
	for range 200 {
		l.observe(time.Millisecond)
	}
	if d := l.deadline(lo, hi); d != lo {
		t.Errorf("1ms probes: deadline %v, want the minimum %v", d, lo)
	}
	for range 200 {
		l.observe(20 * time.Millisecond)
	}
	if d := l.deadline(lo, hi); d != 80*time.Millisecond {
		t.Errorf("20ms probes: deadline %v, want 4 × p99 = 80ms", d)
	}
	for range 200 {
		l.observe(time.Second)
	}
	if d := l.deadline(lo, hi); d != hi {
		t.Errorf("1s probes: deadline %v, want the maximum %v", d, hi)
	}
}

func TestEjector(t *testing.T) {
	now := time.Unix(1000, 0)
	e := NewEjector(time.Second, 8*time.Second, func() time.Time { return now })
	if e.Ejected("w:1") {
		t.Fatal("ejected before any report")
	}
	if d, ok := e.Report("w:1"); d != time.Second || !ok {
		t.Errorf("first report: %v %v, want 1s, ejected", d, ok)
	}
	// Many requests saw the same failure: one ejection.
	for range 50 {
		if _, ok := e.Report("w:1"); ok {
			t.Fatal("a report while ejected ejected again")
		}
	}
	if !e.Ejected("w:1") || e.Ejected("w:2") {
		t.Error("w:1 should be ejected, w:2 not")
	}
	now = now.Add(time.Second)
	if e.Ejected("w:1") {
		t.Error("still ejected after its 1s")
	}
	if d, _ := e.Report("w:1"); d != 2*time.Second {
		t.Errorf("report soon after re-admission: %v, want 2s", d)
	}
	e.Readmit("w:1")
	if e.Ejected("w:1") {
		t.Error("ejected after Readmit")
	}
	now = now.Add(time.Minute)
	if d, _ := e.Report("w:1"); d != time.Second {
		t.Errorf("report long after: %v, want 1s again", d)
	}
}
