package loadbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
)

// IdleConfig is the idle-streams benchmark (issue 27's target "10,000 idle
// ext_proc streams refused or closed within the configured bounds, heap
// back to baseline"): Streams ext_proc streams open against a real
// ext_proc server bounded by MaxStreams and RequestTimeout, each silent
// (it never sends a message), over Conns connections, as anything that
// reaches the port could.
type IdleConfig struct {
	// Streams opened (default 10000).
	Streams int
	// Conns is how many gRPC connections carry them (default 100).
	Conns int
	// MaxStreams and RequestTimeout are the server's bounds
	// (extproc.Config; defaults 2000 and 5 s).
	MaxStreams     int
	RequestTimeout time.Duration
	// Rounds the streams are opened in turn (default 2): the heap after
	// the first round holds what the Go runtime keeps of a peak of
	// goroutines (their descriptors, runtime.malg, are kept for reuse,
	// never freed), so "back to baseline" is each later round ending
	// where the first did.
	Rounds int
}

// IdleResult is what the benchmark saw.
type IdleResult struct {
	Streams, MaxStreams int
	RequestTimeout      time.Duration
	// Refused ended with RESOURCE_EXHAUSTED (over MaxStreams), Closed
	// with DEADLINE_EXCEEDED (RequestTimeout), Other otherwise.
	Refused, Closed, Other int
	FirstOther             string
	// ServerRefused are kvgate_extproc_streams_refused_total's counts.
	ServerRefused map[string]float64
	// ClosedAfterMin and ClosedAfterMax are the shortest and longest
	// times from opening to the end of a Closed stream.
	ClosedAfterMin, ClosedAfterMax time.Duration
	// Heap (after a GC) and goroutines: before the streams (server up,
	// connections dialled), while the admitted streams are held, and
	// after every stream ended. The client and the server run in this
	// process: both ends count.
	HeapBefore, HeapHeld, HeapAfter                   uint64
	GoroutinesBefore, GoroutinesHeld, GoroutinesAfter int
	// HeapAfterRounds is HeapAfter of each round (the last is HeapAfter).
	HeapAfterRounds []uint64
	// ActiveHeld and ActiveAfter are kvgate_extproc_streams_active.
	ActiveHeld, ActiveAfter float64
	Elapsed                 time.Duration
}

func (c IdleConfig) withDefaults() IdleConfig {
	if c.Streams <= 0 {
		c.Streams = 10000
	}
	if c.Conns <= 0 {
		c.Conns = 100
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 2000
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 5 * time.Second
	}
	if c.Rounds <= 0 {
		c.Rounds = 2
	}
	return c
}

// noDecider is the seam of a server whose streams never reach a decision.
type noDecider struct{}

func (noDecider) Decide(context.Context, *globalrouter.Request) (*globalrouter.Decision, error) {
	return nil, errors.New("idle bench: no stream should reach a decision")
}

// heapNow is the live heap after a GC, and the goroutine count.
func heapNow() (uint64, int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, runtime.NumGoroutine()
}

// Idle runs the idle-streams benchmark.
func Idle(ctx context.Context, cfg IdleConfig) (*IdleResult, error) {
	cfg = cfg.withDefaults()
	if cfg.MaxStreams >= cfg.Streams {
		return nil, fmt.Errorf("idle: -max-streams %d must be below the streams opened (%d), or nothing is refused", cfg.MaxStreams, cfg.Streams)
	}
	if _, err := raiseFDLimitTo(sysFDLimit{}, cfg.Streams, uint64(4*cfg.Conns)+fdsBase, 0); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	srv, err := extproc.New(extproc.Config{MaxStreams: cfg.MaxStreams, RequestTimeout: cfg.RequestTimeout, IdleTimeout: -1}, noDecider{}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, lis) }()
	defer func() { stop(); <-served }()
	conns := make([]*grpc.ClientConn, cfg.Conns)
	for i := range conns {
		if conns[i], err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, err
		}
		conns[i].Connect()
		defer conns[i].Close()
	}
	for _, c := range conns { // connected before the baseline
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				return nil, fmt.Errorf("idle: dial %s: %w", lis.Addr(), ctx.Err())
			}
		}
	}
	res := &IdleResult{Streams: cfg.Streams, MaxStreams: cfg.MaxStreams, RequestTimeout: cfg.RequestTimeout, ServerRefused: map[string]float64{}}
	res.HeapBefore, res.GoroutinesBefore = heapNow()

	start := time.Now()
	for r := range cfg.Rounds {
		if err := idleRound(ctx, cfg, conns, reg, res, r == 0); err != nil {
			return nil, err
		}
	}
	res.Elapsed = time.Since(start)
	res.Streams = cfg.Streams * cfg.Rounds

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_extproc_streams_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			res.ServerRefused[labelValue(m, "reason")] = m.GetCounter().GetValue()
		}
	}
	return res, nil
}

// idleRound opens cfg.Streams silent streams, waits for each to end, and
// adds what it saw to res (the held figures on the first round).
func idleRound(ctx context.Context, cfg IdleConfig, conns []*grpc.ClientConn, reg *prometheus.Registry, res *IdleResult, first bool) error {
	type end struct {
		code  codes.Code
		msg   string
		after time.Duration
	}
	ends := make(chan end, cfg.Streams)
	var opened sync.WaitGroup
	opened.Add(cfg.Streams)
	sctx2, cancelStreams := context.WithCancel(ctx)
	defer cancelStreams()
	open := func(i int) {
		t0 := time.Now()
		st, err := extprocv3.NewExternalProcessorClient(conns[i%len(conns)]).Process(sctx2)
		opened.Done()
		if err == nil {
			_, err = st.Recv() // silent: the server's answer is how it ends
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		s, _ := status.FromError(err)
		ends <- end{s.Code(), s.Message(), time.Since(t0)}
	}
	// The first MaxStreams fill the server (awaited on its gauge, or until
	// one of them ends: a loaded machine may take a bound's length to
	// open them), then the rest arrive over the limit.
	for i := range cfg.MaxStreams {
		go open(i)
	}
	for gaugeValue(reg, "kvgate_extproc_streams_active") < float64(cfg.MaxStreams) && len(ends) == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	for i := cfg.MaxStreams; i < cfg.Streams; i++ {
		go open(i)
	}
	opened.Wait()
	// Held: the server admitted what it will; the rest were refused at
	// once. Measure once every refusal is in.
	refusedWant := cfg.Streams - cfg.MaxStreams
	got := make([]end, 0, cfg.Streams)
	for len(got) < refusedWant {
		select {
		case e := <-ends:
			got = append(got, e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if first {
		res.HeapHeld, res.GoroutinesHeld = heapNow()
		res.ActiveHeld = gaugeValue(reg, "kvgate_extproc_streams_active")
	}
	for len(got) < cfg.Streams {
		select {
		case e := <-ends:
			got = append(got, e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, e := range got {
		switch e.code {
		case codes.ResourceExhausted:
			res.Refused++
		case codes.DeadlineExceeded:
			res.Closed++
			if res.ClosedAfterMin == 0 || e.after < res.ClosedAfterMin {
				res.ClosedAfterMin = e.after
			}
			res.ClosedAfterMax = max(res.ClosedAfterMax, e.after)
		default:
			res.Other++
			if res.FirstOther == "" {
				res.FirstOther = e.code.String() + ": " + e.msg
			}
		}
	}
	got, ends = nil, nil // the bench's own bookkeeping is not the server's heap
	if err := awaitGauge(ctx, reg, "kvgate_extproc_streams_active", 0); err != nil {
		return err
	}
	res.ActiveAfter = gaugeValue(reg, "kvgate_extproc_streams_active")
	awaitGoroutines(ctx, res.GoroutinesBefore, 5*time.Second)
	res.HeapAfter, res.GoroutinesAfter = heapNow()
	res.HeapAfterRounds = append(res.HeapAfterRounds, res.HeapAfter)
	return nil

}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func gaugeValue(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// awaitGauge polls a gauge until it reads want (the server updates it as
// its handlers return, after the client saw the stream end).
func awaitGauge(ctx context.Context, reg *prometheus.Registry, name string, want float64) error {
	for gaugeValue(reg, name) != want {
		select {
		case <-ctx.Done():
			return fmt.Errorf("idle: %s reads %v, want %v: %w", name, gaugeValue(reg, name), want, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// awaitGoroutines polls until the goroutine count is back to at most n
// (gRPC's stream goroutines exit after the streams' ends are delivered),
// for at most patience: the count after it is the figure either way.
func awaitGoroutines(ctx context.Context, n int, patience time.Duration) {
	deadline := time.Now().Add(patience)
	for runtime.NumGoroutine() > n && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
