package flowcontrol_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gate is a fake pool (the seam Try replaces): saturated until opened,
// then it takes `room` requests.
type gate struct {
	mu    sync.Mutex
	room  int
	order []string
}

func (g *gate) try(name string) flowcontrol.Try {
	return func(context.Context) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.room == 0 {
			return flowcontrol.ErrSaturated
		}
		g.room--
		g.order = append(g.order, name)
		return nil
	}
}

func (g *gate) open(n int) {
	g.mu.Lock()
	g.room += n
	g.mu.Unlock()
}

func newLive(t *testing.T, cfg flowcontrol.Config) (*flowcontrol.Live, *prometheus.Registry) {
	t.Helper()
	cfg.Enabled = true
	if cfg.Reprobe == 0 {
		cfg.Reprobe = time.Hour // kicks only: the test says when
	}
	reg := prometheus.NewRegistry()
	m, err := flowcontrol.NewMetrics(reg, 2)
	if err != nil {
		t.Fatal(err)
	}
	l, err := flowcontrol.NewLive(cfg, nil, m.For("q"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, reg
}

// waitDepth polls until n requests wait.
func waitDepth(t *testing.T, l *flowcontrol.Live, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		total := 0
		for _, b := range l.Stats() {
			total += b.Requests
		}
		if total == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting, want %d", total, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLiveDispatchOrder(t *testing.T) {
	l, reg := newLive(t, flowcontrol.Config{})
	g := &gate{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 4)
	for i, r := range []struct {
		name string
		prio int
		flow string
	}{{"low-a", 0, "a"}, {"low-b", 0, "b"}, {"high", 1, "a"}, {"low-a2", 0, "a"}} {
		go func() { errs <- l.Wait(ctx, flowcontrol.Request{Priority: r.prio, Flow: r.flow}, g.try(r.name), nil) }()
		waitDepth(t, l, i+1) // arrival order is the test's
	}
	l.Kick() // still saturated: nothing goes
	g.open(4)
	l.Kick()
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("Wait: %v", err)
		}
	}
	want := []string{"high", "low-a", "low-b", "low-a2"}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.order) != 4 || g.order[0] != want[0] || g.order[1] != want[1] || g.order[2] != want[2] || g.order[3] != want[3] {
		t.Errorf("dispatched %v, want %v", g.order, want)
	}
	if got := testutil.ToFloat64(mustVec(t, reg, "kvgate_flowcontrol_dispatches_total")); got != 4 {
		t.Errorf("dispatches %v, want 4", got)
	}
}

func mustVec(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sum"})
	c.Add(total)
	return c
}

func TestLiveCancelLeavesAtOnce(t *testing.T) {
	l, _ := newLive(t, flowcontrol.Config{})
	g := &gate{}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- l.Wait(ctx, flowcontrol.Request{}, g.try("x"), nil) }()
	waitDepth(t, l, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: got %v, want context.Canceled", err)
	}
	waitDepth(t, l, 0)
}

func TestLiveUndoWhenClientLeftDuringTry(t *testing.T) {
	l, _ := newLive(t, flowcontrol.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	entered, release := make(chan struct{}), make(chan struct{})
	undone := make(chan struct{})
	try := func(context.Context) error {
		close(entered)
		<-release
		return nil // it went, but its client left meanwhile
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Wait(ctx, flowcontrol.Request{}, try, func() { close(undone) }) }()
	waitDepth(t, l, 1)
	l.Kick()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: got %v, want context.Canceled at once, during the try", err)
	}
	close(release)
	<-undone // what the try took is given back
	waitDepth(t, l, 0)
}

func TestLiveDeadlineAndFull(t *testing.T) {
	l, reg := newLive(t, flowcontrol.Config{Deadline: 50 * time.Millisecond, Capacity: flowcontrol.Capacity{Requests: 1}})
	g := &gate{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- l.Wait(ctx, flowcontrol.Request{}, g.try("x"), nil) }()
	waitDepth(t, l, 1)
	var rf *flowcontrol.Refused
	if err := l.Wait(ctx, flowcontrol.Request{}, g.try("y"), nil); !errors.As(err, &rf) || rf.Reason != flowcontrol.ReasonQueueFull {
		t.Errorf("second request: got %v, want queue_full", err)
	}
	if err := <-errc; !errors.As(err, &rf) || rf.Reason != flowcontrol.ReasonDeadline {
		t.Errorf("first request: got %v, want queue_deadline", err)
	}
	if got := testutil.ToFloat64(mustVec(t, reg, "kvgate_flowcontrol_refusals_total")); got != 2 {
		t.Errorf("refusals %v, want 2", got)
	}
}

func TestLiveCloseRefusesWaiting(t *testing.T) {
	l, _ := newLive(t, flowcontrol.Config{})
	errc := make(chan error, 1)
	go func() { errc <- l.Wait(context.Background(), flowcontrol.Request{}, (&gate{}).try("x"), nil) }()
	waitDepth(t, l, 1)
	l.Close()
	var rf *flowcontrol.Refused
	if err := <-errc; !errors.As(err, &rf) || rf.Reason != flowcontrol.ReasonClosed {
		t.Errorf("got %v, want queue_closed", err)
	}
}

// TestMetricsFoldFlows: past max_flow_labels tenants (2 here) the depth
// gauge counts the rest as "other"; untenanted requests are "none".
func TestMetricsFoldFlows(t *testing.T) {
	l, reg := newLive(t, flowcontrol.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 5)
	for i, flow := range []string{"a", "b", "c", "d", ""} {
		go func() { errs <- l.Wait(ctx, flowcontrol.Request{Flow: flow}, (&gate{}).try(flow), nil) }()
		waitDepth(t, l, i+1)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_flowcontrol_queue_depth_requests" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "flow" {
					got[lp.GetValue()] += m.GetGauge().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"a": 1, "b": 1, flowcontrol.OtherFlow: 2, flowcontrol.NoFlow: 1}
	if len(got) != len(want) || got["a"] != 1 || got["b"] != 1 || got["other"] != 2 || got["none"] != 1 {
		t.Errorf("depth by flow label: got %v, want %v", got, want)
	}
	cancel()
	for range 5 {
		<-errs
	}
	waitDepth(t, l, 0)
}

// A try that refuses (Late, at dispatch) ends its request with that
// refusal, counted as one, and the queue goes on to the next.
func TestLiveTryRefused(t *testing.T) {
	l, reg := newLive(t, flowcontrol.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	late := flowcontrol.Late(&flowcontrol.Request{Wait: time.Millisecond}, time.Millisecond, time.Millisecond)
	errc, errc2 := make(chan error, 1), make(chan error, 1)
	go func() { errc <- l.Wait(ctx, flowcontrol.Request{}, func(context.Context) error { return late }, nil) }()
	waitDepth(t, l, 1)
	go func() { errc2 <- l.Wait(ctx, flowcontrol.Request{}, func(context.Context) error { return nil }, nil) }()
	waitDepth(t, l, 2)
	l.Kick()
	var rf *flowcontrol.Refused
	if err := <-errc; !errors.As(err, &rf) || rf.Reason != flowcontrol.ReasonLate || rf.Band != "default" {
		t.Fatalf("first: got %v, want queue_late in band default", err)
	}
	if err := <-errc2; err != nil {
		t.Errorf("second, dispatched after the refusal: %v", err)
	}
	if got := testutil.ToFloat64(mustVec(t, reg, "kvgate_flowcontrol_refusals_total")); got != 1 {
		t.Errorf("refusals %v, want 1", got)
	}
}

// TestLiveKickWhileDeciding: a lease freed room while the request made
// its own decision (saturated) and before it joined the queue; that Kick
// found the queue empty. WaitAfter dispatches it at once, not at the next
// Kick or re-probe tick (an hour here: the test would time out).
func TestLiveKickWhileDeciding(t *testing.T) {
	l, _ := newLive(t, flowcontrol.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := l.Kicks() // the request decides: saturated
	l.Kick()          // a lease frees meanwhile: nothing waits yet
	if err := l.WaitAfter(ctx, flowcontrol.Request{}, seen, func(context.Context) error { return nil }, nil); err != nil {
		t.Fatalf("WaitAfter: got %v, want dispatched on the Kick it missed", err)
	}
}
