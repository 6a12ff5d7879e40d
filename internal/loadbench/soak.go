package loadbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/pool"
)

// SoakConfig shapes the soak.
type SoakConfig struct {
	// Streams is the number of concurrent streaming requests.
	Streams int
	// Hold is how long they are held once all are streaming.
	Hold time.Duration
	// Channel: the global router uses the local-router channel (else
	// unary probes and a Track stream per request).
	Channel bool
	// Pools × Workers mock workers (default 2 × 8).
	Pools, Workers int
	// Speedup of the mock workers' timing model (default 0.002: slow
	// enough that thousands of held streams decode a token every few
	// seconds, so the machine measures holding them, not decoding).
	Speedup float64
	// Ramp bounds how long opening the streams may take (default 4 min).
	Ramp time.Duration
	// ProbeTimeout is the global router's probe deadline (default 1 s:
	// the soak measures concurrency, and on a loaded machine the 20 ms
	// default turns CPU starvation into refused requests).
	ProbeTimeout time.Duration
	// Opening bounds the streams opening at once (default 1,024).
	Opening int
	// SteadyEvery paces the short requests sent during the hold, whose
	// decisions are the steady-state figures (default 50 ms; negative:
	// none).
	SteadyEvery time.Duration
	// ProfileDir, when set, receives a CPU profile of the ramp
	// (ramp.cpu.prof) and goroutine dumps (goroutines-<s>s.txt, pprof's
	// debug=1: stacks counted) every 20 s of the ramp and once in the hold:
	// what the ramp waits on.
	ProfileDir string
	// HTTP2: the load client reaches the gateway over h2c (a few
	// connections, 1,000 streams each) and the gateway the mock workers
	// too, so a held stream costs no descriptor of its own; false: HTTP/1.1,
	// ~4 descriptors per stream.
	HTTP2 bool
	// Logger is the system's (the routers', workers', gateway's); Progress
	// the soak's own (ramp progress, the limit raised; default Logger).
	Logger, Progress *slog.Logger
}

// SoakResult is the soak's figures.
type SoakResult struct {
	// Streams were in flight at once (response headers received).
	Streams int `json:"streams"`
	// HeapBytesPerStream is the live heap growth per stream, while they
	// were held, of allocations made by kvgate's router code (ext_proc,
	// global router, pool, local router, and the gRPC servers' transport),
	// from the runtime's heap profile.
	HeapBytesPerStream float64 `json:"heap_bytes_per_stream"`
	// AllHeapBytesPerStream is the whole process's: the gateway, its HTTP
	// connections, the mock workers and the load client too.
	AllHeapBytesPerStream float64 `json:"all_heap_bytes_per_stream"`
	// GoroutinesPerStream counts the goroutines running kvgate's router
	// code (ext_proc, global router, pool, local router) per stream.
	GoroutinesPerStream float64 `json:"goroutines_per_stream"`
	// AllGoroutinesPerStream counts every goroutine of the process.
	AllGoroutinesPerStream float64 `json:"all_goroutines_per_stream"`
	// DecisionP99us is the p99 of the global router's decision histogram
	// over the run (interpolated within its buckets: 1, 2, 5, 10 ms…).
	DecisionP99us float64 `json:"decision_p99_us"`
	// Ramp* are the decisions made while the streams were opening
	// (cfg.Opening at once); Steady* those of the paced short requests
	// sent while all the streams were held (one every SteadyEvery), the
	// decision of one request among thousands in flight. Interpolated
	// within the histogram's buckets.
	RampDecisionP50us   float64 `json:"ramp_decision_p50_us"`
	RampDecisionP99us   float64 `json:"ramp_decision_p99_us"`
	SteadyDecisions     int     `json:"steady_decisions"`
	SteadyDecisionP50us float64 `json:"steady_decision_p50_us"`
	SteadyDecisionP99us float64 `json:"steady_decision_p99_us"`
	// SteadyFailed are the paced requests that got no response headers.
	SteadyFailed int `json:"steady_failed"`
	// LeakedRequests are the requests still in flight on the local routers
	// after every stream ended (want 0).
	LeakedRequests int `json:"leaked_requests"`
	// Failed streams (no first token, or a refused request).
	Failed int `json:"failed"`
	// CPUusPerStream is the process's CPU time per stream over the run.
	CPUusPerStream float64 `json:"cpu_us_per_stream"`
	Channel        bool    `json:"channel"`
	// RampSeconds is how long opening the streams took.
	RampSeconds float64 `json:"ramp_seconds"`
	// FirstError is why the first failed stream failed.
	FirstError string `json:"first_error,omitempty"`
}

// Soak starts a whole system in process (etcd, NATS, Pools × Workers mock
// workers, their local routers, the ext_proc server and the gateway, which
// plays Envoy with envoy/extprocclient), opens cfg.Streams concurrent
// streaming completions through the gateway, holds them for cfg.Hold,
// cancels them (the client going away: the break path), and reports the
// figures, leaked load included.
func Soak(ctx context.Context, cfg SoakConfig) (SoakResult, error) {
	if cfg.Streams <= 0 {
		return SoakResult{}, errors.New("soak: need at least one stream")
	}
	config.PositiveOr(&cfg.Pools, 2)
	config.PositiveOr(&cfg.Workers, 8)
	config.PositiveOr(&cfg.Speedup, 0.002)
	config.PositiveOr(&cfg.Ramp, 4*time.Minute)
	config.PositiveOr(&cfg.ProbeTimeout, time.Second)
	config.PositiveOr(&cfg.Opening, 1024)
	if cfg.SteadyEvery == 0 {
		cfg.SteadyEvery = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = cfg.Logger
	}
	// Enough descriptors for every stream, or no soak at all: never a run
	// that fails with "too many open files" halfway up the ramp.
	need, per := SoakFDs(cfg.Streams), fdsPerStream
	if cfg.HTTP2 {
		need, per = SoakFDsHTTP2(cfg.Streams, cfg.Pools*cfg.Workers), 0
	}
	fds, err := raiseFDLimitTo(sysFDLimit{}, cfg.Streams, need, per)
	if err != nil {
		return SoakResult{}, err
	}
	cfg.Progress.Info("soak: file-descriptor limit", "RLIMIT_NOFILE", fds, "need", need, "http2", cfg.HTTP2)
	// Sample the heap profile finely enough to attribute the streams'
	// memory (restored at the end).
	defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
	runtime.MemProfileRate = 4096
	ucfg := up.DefaultConfig()
	ucfg.OnLoopback() // the admin too: a soak beside a running `kvgate up` (admin 127.0.0.1:8081) once failed to start
	ucfg.Pools = nil
	for i := range cfg.Pools {
		ucfg.Pools = append(ucfg.Pools, up.PoolSpec{Name: fmt.Sprintf("pool-%d", i), Workers: cfg.Workers})
	}
	ucfg.Speedup = cfg.Speedup
	ucfg.ProbeTimeout = cfg.ProbeTimeout
	ucfg.NumBlocks = 1 << 16
	ucfg.MetricsPeriod = -1
	ucfg.Logger = cfg.Logger
	ucfg.UpstreamHTTP2 = cfg.HTTP2
	if !cfg.Channel {
		ucfg.GlobalOptions = []globalrouter.Option{globalrouter.WithDialer(pool.GRPCDialer())}
	}
	sys, err := up.Start(ctx, ucfg)
	if err != nil {
		return SoakResult{}, err
	}
	defer func() { _ = sys.CloseWithin(30 * time.Second) }()
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConnsPerHost: -1, DisableCompression: true, ForceAttemptHTTP2: false,
	}
	if cfg.HTTP2 {
		// h2c with prior knowledge; past a connection's stream limit the
		// transport opens another (not StrictMaxConcurrentStreams):
		// streams/1,000 + 1 connections.
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = &p
		tr.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: h2StreamsPerConn}
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	url := sys.GatewayURL() + "/v1/completions"

	// Warm up (tokenizer, connections), then the baseline.
	if err := oneRequest(ctx, hc, url, ucfg.Model); err != nil {
		return SoakResult{}, fmt.Errorf("soak: warm-up request: %w", err)
	}
	heap0, rheap0, gor0, router0 := measure()
	cpu0 := CPUTime()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		streaming atomic.Int64
		failed    atomic.Int64
		wg        sync.WaitGroup
		firstErr  atomic.Pointer[error]
	)
	ready := make(chan struct{}, cfg.Streams)
	// Open at a bounded pace so the ramp itself is not a connect storm.
	sem := make(chan struct{}, cfg.Opening)
	for i := range cfg.Streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			released := false
			release := func() {
				if !released {
					released = true
					<-sem
				}
			}
			defer release()
			err := stream(sctx, hc, url, ucfg.Model, i, func() {
				streaming.Add(1)
				release()
				ready <- struct{}{}
			})
			if err != nil && sctx.Err() == nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		}()
	}
	rampStart := time.Now()
	stopProf := startProfiles(cfg.ProfileDir, cfg.Progress)
	rampEnd := time.After(cfg.Ramp)
	dump := time.NewTicker(20 * time.Second)
	defer dump.Stop()
	n := 0
ramp:
	for n < cfg.Streams {
		select {
		case <-ready:
			n++
		case <-dump.C:
			dumpGoroutines(cfg.ProfileDir, time.Since(rampStart), cfg.Progress)
			cfg.Progress.Info("soak: ramping", "streaming", n, "failed", failed.Load(), "elapsed", time.Since(rampStart).Round(time.Second))
		case <-rampEnd:
			break ramp
		case <-ctx.Done():
			stopProf()
			return SoakResult{}, ctx.Err()
		}
		if int(failed.Load())+n >= cfg.Streams {
			break
		}
	}
	rampTook := time.Since(rampStart)
	stopProf()
	cfg.Progress.Info("soak: streams open", "streaming", n, "failed", failed.Load(), "ramp", rampTook.Round(time.Millisecond))
	rampHist := decisionHist(sys)
	held := time.NewTimer(cfg.Hold)
	// Measure halfway through the hold (after the ramp's garbage is gone),
	// the paced requests paused meanwhile.
	steady := startSteady(sctx, hc, url, ucfg.Model, cfg.SteadyEvery)
	select {
	case <-time.After(cfg.Hold / 2):
	case <-ctx.Done():
	}
	steady.pause(true)
	dumpGoroutines(cfg.ProfileDir, time.Since(rampStart), cfg.Progress)
	heap1, rheap1, gor1, router1 := measure()
	steady.pause(false)
	select {
	case <-held.C:
	case <-ctx.Done():
	}
	steadyN, steadyFailed := steady.stop()
	steadyHist := decisionHist(sys).minus(rampHist)
	cancel()
	wg.Wait()
	cpu := CPUTime() - cpu0

	// Every router's in-flight count back to 0: the ends reach the local
	// routers asynchronously; give them a while.
	leaked := 0
	deadline := time.Now().Add(30 * time.Second)
	for {
		leaked = 0
		for _, p := range sys.Pools {
			leaked += p.Requests()
		}
		if leaked == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the routers' counts
	}
	res := SoakResult{
		Streams: n, LeakedRequests: leaked, Failed: int(failed.Load()), Channel: cfg.Channel,
		DecisionP99us:     decisionHist(sys).quantile(0.99) * 1e6,
		RampDecisionP50us: rampHist.quantile(0.5) * 1e6, RampDecisionP99us: rampHist.quantile(0.99) * 1e6,
		SteadyDecisions:     int(steadyHist.total),
		SteadyDecisionP50us: steadyHist.quantile(0.5) * 1e6, SteadyDecisionP99us: steadyHist.quantile(0.99) * 1e6,
		SteadyFailed: steadyFailed,
	}
	cfg.Progress.Info("soak: steady requests", "sent", steadyN, "failed", steadyFailed, "decisions", steadyHist.total)
	if n > 0 {
		res.AllHeapBytesPerStream = float64(int64(heap1)-int64(heap0)) / float64(n)
		res.HeapBytesPerStream = float64(rheap1-rheap0) / float64(n)
		res.GoroutinesPerStream = float64(router1-router0) / float64(n)
		res.AllGoroutinesPerStream = float64(gor1-gor0) / float64(n)
		res.CPUusPerStream = float64(cpu.Microseconds()) / float64(n)
	}
	res.RampSeconds = rampTook.Seconds()
	if e := firstErr.Load(); e != nil {
		res.FirstError = (*e).Error()
	}
	return res, nil
}
