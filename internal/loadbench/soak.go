package loadbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/up"
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
	if cfg.Pools <= 0 {
		cfg.Pools = 2
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Speedup <= 0 {
		cfg.Speedup = 0.002
	}
	if cfg.Ramp <= 0 {
		cfg.Ramp = 4 * time.Minute
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = time.Second
	}
	if cfg.Opening <= 0 {
		cfg.Opening = 1024
	}
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
	ucfg.GatewayAddr, ucfg.ExtprocAddr = "127.0.0.1:0", "127.0.0.1:0"
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
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = sys.Close(cctx)
	}()
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

// oneRequest runs a short completion to the end.
func oneRequest(ctx context.Context, hc *http.Client, url, model string) error {
	body := fmt.Sprintf(`{"model":%q,"prompt":"warm up the soak","max_tokens":2,"stream":true}`, model)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// stream opens streaming completion i, calls open once its response
// headers came (the decision is made and the worker has it), and reads it
// until ctx ends. A stream that ends before is an error.
func stream(ctx context.Context, hc *http.Client, url, model string, i int, open func()) error {
	// Prompts share a prefix by family, as chat traffic does.
	prompt := fmt.Sprintf("system prompt of family %d: you are a helpful assistant. ", i%32) + strings.Repeat("context ", 40) + fmt.Sprintf("question %d", i)
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4096,"stream":true}`, model, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	open()
	_, err = io.Copy(io.Discard, resp.Body)
	if ctx.Err() == nil {
		return fmt.Errorf("stream ended during the hold: %v", err)
	}
	return nil
}

// routerFrames mark a goroutine, or an allocation, of kvgate's router
// code; serverFrames the gRPC servers' (the ext_proc server and the local
// routers are this process's gRPC servers besides embedded etcd).
var (
	routerFrames = []string{
		"github.com/kvgate/kvgate/extproc.",
		"github.com/kvgate/kvgate/globalrouter.",
		"github.com/kvgate/kvgate/pool.",
		"github.com/kvgate/kvgate/localrouter",
	}
	serverFrames = []string{
		"google.golang.org/grpc/internal/transport.(*http2Server)",
		"google.golang.org/grpc/internal/transport.NewServerTransport",
		"google.golang.org/grpc.(*Server)",
	}
)

func hasFrame(s string, frames []string) bool {
	for _, f := range frames {
		if strings.HasPrefix(s, f) {
			return true
		}
	}
	return false
}

// measure returns the live heap after a GC, the part of it the router
// code allocated (heap profile, scaled as pprof scales it), the
// goroutines, and those running router code.
func measure() (heap uint64, routerHeap int64, goroutines, router int) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		goroutines++
		for _, f := range routerFrames {
			if bytes.Contains(g, []byte(f)) {
				router++
				break
			}
		}
	}
	n, _ := runtime.MemProfile(nil, false)
	recs := make([]runtime.MemProfileRecord, n+256)
	n, _ = runtime.MemProfile(recs, false)
	isRouter := map[uintptr]bool{}
	rate := float64(runtime.MemProfileRate)
	for _, r := range recs[:n] {
		inuse := r.InUseBytes()
		if inuse <= 0 || r.AllocObjects == 0 {
			continue
		}
		ours := false
		for _, pc := range r.Stack() {
			v, ok := isRouter[pc]
			if !ok {
				fn := runtime.FuncForPC(pc)
				v = fn != nil && (hasFrame(fn.Name(), routerFrames) || hasFrame(fn.Name(), serverFrames))
				isRouter[pc] = v
			}
			if v {
				ours = true
				break
			}
		}
		if !ours {
			continue
		}
		// pprof's scaling of a sampled record.
		avg := float64(r.AllocBytes) / float64(r.AllocObjects)
		scale := 1 / (1 - math.Exp(-avg/rate))
		routerHeap += int64(float64(inuse) * scale)
	}
	return m.HeapAlloc, routerHeap, goroutines, router
}

// hist is the global router's decision histogram, every outcome merged:
// cumulative counts per upper bound.
type hist struct {
	bounds []float64
	counts []uint64
	total  uint64
}

func decisionHist(sys *up.System) hist {
	var h hist
	mfs, err := sys.Registry.Gather()
	if err != nil {
		return h
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_globalrouter_decision_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			ph := m.GetHistogram()
			h.total += ph.GetSampleCount()
			h.add(ph)
		}
	}
	return h
}

func (h *hist) add(ph *dto.Histogram) {
	for i, b := range ph.GetBucket() {
		if i >= len(h.bounds) {
			h.bounds = append(h.bounds, b.GetUpperBound())
			h.counts = append(h.counts, 0)
		}
		h.counts[i] += b.GetCumulativeCount()
	}
}

// minus is the observations of h not in an earlier snapshot of it.
func (h hist) minus(earlier hist) hist {
	out := hist{bounds: h.bounds, counts: make([]uint64, len(h.counts)), total: h.total - earlier.total}
	for i := range h.counts {
		out.counts[i] = h.counts[i]
		if i < len(earlier.counts) {
			out.counts[i] -= earlier.counts[i]
		}
	}
	return out
}

// quantile interpolates linearly within the bucket holding quantile q (0
// without observations; past the last bucket, its bound).
func (h hist) quantile(q float64) float64 {
	if h.total == 0 {
		return 0
	}
	want := q * float64(h.total)
	lo, prev := 0.0, uint64(0)
	for i, b := range h.bounds {
		if float64(h.counts[i]) >= want && h.counts[i] > prev {
			frac := (want - float64(prev)) / float64(h.counts[i]-prev)
			return lo + frac*(b-lo)
		}
		lo, prev = b, h.counts[i]
	}
	return lo
}

// steadyLoad sends one short streaming request every period while the
// streams are held, each cancelled once its response headers came (its
// decision made, on its worker): the decisions of the steady state.
type steadyLoad struct {
	paused       atomic.Bool
	sent, failed atomic.Int64
	wg           sync.WaitGroup
	cancel       context.CancelFunc
}

func startSteady(ctx context.Context, hc *http.Client, url, model string, period time.Duration) *steadyLoad {
	ctx, cancel := context.WithCancel(ctx)
	s := &steadyLoad{cancel: cancel}
	if period < 0 {
		return s
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if s.paused.Load() {
				continue
			}
			s.sent.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				rctx, rcancel := context.WithCancel(ctx)
				defer rcancel()
				// Headers received: decided and on its worker; go away.
				err := stream(rctx, hc, url, model, 1_000_000+i, rcancel)
				if err != nil && ctx.Err() == nil {
					s.failed.Add(1)
				}
			}()
		}
	}()
	return s
}

func (s *steadyLoad) pause(p bool) { s.paused.Store(p) }

// stop ends the paced requests and waits for them.
func (s *steadyLoad) stop() (sent, failed int) {
	s.cancel()
	s.wg.Wait()
	return int(s.sent.Load()), int(s.failed.Load())
}

// startProfiles starts a CPU profile into dir (none when dir is empty) and
// returns its stop.
func startProfiles(dir string, log *slog.Logger) (stop func()) {
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, "ramp.cpu.prof"))
	if err != nil {
		log.Warn("soak: cpu profile", "err", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Warn("soak: cpu profile", "err", err)
		f.Close()
		return func() {}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}
}

// dumpGoroutines writes the goroutine profile (stacks counted) into dir.
func dumpGoroutines(dir string, at time.Duration, log *slog.Logger) {
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("goroutines-%03.0fs.txt", at.Seconds())))
	if err != nil {
		log.Warn("soak: goroutine dump", "err", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("goroutine").WriteTo(f, 1); err != nil {
		log.Warn("soak: goroutine dump", "err", err)
	}
}
