// Package chaos is `kvgate bench --chaos`: it starts the whole `kvgate up`
// system in the process, drives N concurrent streaming chat requests
// through its gateway for a while, kills parts (a local router, a worker,
// NATS, etcd) one after another and brings them back, and reports what the
// clients saw: requests, errors by reason and by the fault active when
// they started, latency percentiles, recovery time per fault, memory, and
// the load every local router still counts once the traffic has stopped
// (the leaked load, which must be 0); with Config.Accounting, the routers'
// in-flight count against the engines' running+waiting, sampled, and
// request by request.
//
// Files: chaos.go (Run, the faults, the report), accounting.go (the
// -accounting samples and their report), perrequest.go (-accounting's
// per-request comparison: each request's router commit and free, engine
// admission and departure, joined by id).
package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/lib/config"
)

// Faults that can be injected, in the order they run when all are asked.
const (
	FaultRouter = "router" // pool-a's local router stops, then restarts
	FaultWorker = "worker" // pool-a's first worker is killed mid-stream, then restarted
	FaultNATS   = "nats"   // NATS stops, then restarts on the same port
	FaultEtcd   = "etcd"   // etcd stops, then restarts on the same port and data
)

// Config shapes a run. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Streams is the number of concurrent clients, each sending one
	// streamed request after another.
	Streams int
	// Duration is how long the clients send.
	Duration time.Duration
	// Kill lists the faults, injected in turn at evenly spaced times.
	Kill []string
	// Hold is how long each killed part stays down.
	Hold time.Duration
	// MaxTokens is each request's max_tokens.
	MaxTokens int
	// RequestTimeout bounds one request; a request that reaches it counts
	// as hung.
	RequestTimeout time.Duration
	// ErrorPause is how long a client waits after a failed request before
	// its next one, as OpenAI's client libraries back off before a retry
	// (they start at 0.5 s); 0 sends the next at once, a retry storm that
	// measures the storm rather than the fault. Negative means 0.
	ErrorPause time.Duration
	// Up is the system; its addresses are forced to free loopback ports.
	Up     up.Config
	Logger *slog.Logger
	// Accounting samples the routers' in-flight count and the engines'
	// running+waiting every AccountingInterval from the start of the
	// traffic until the leaked-load wait ends, and reports how they
	// compare (Report.Accounting; accounting.go).
	Accounting bool
}

// DefaultConfig is 200 streams for 60 s, every fault in turn, 5 s each,
// against `kvgate up`'s system with workers 10× faster than a GPU.
func DefaultConfig() Config {
	u := up.DefaultConfig()
	u.Speedup = 10
	return Config{
		Streams: 200, Duration: 60 * time.Second, Kill: []string{FaultRouter, FaultWorker, FaultNATS, FaultEtcd},
		Hold: 5 * time.Second, MaxTokens: 32, RequestTimeout: 30 * time.Second, ErrorPause: 250 * time.Millisecond, Up: u,
	}
}

// Report is what a run measured.
type Report struct {
	Streams         int            `json:"streams"`
	DurationSeconds float64        `json:"duration_seconds"`
	Requests        int            `json:"requests"`
	OK              int            `json:"ok"`
	Errors          map[string]int `json:"errors"` // by reason
	// Samples holds the first client-facing message of each reason.
	Samples        map[string]string `json:"samples"`
	Hung           int               `json:"hung"`
	LatencyP50Ms   float64           `json:"latency_p50_ms"`
	LatencyP99Ms   float64           `json:"latency_p99_ms"`
	TTFTP50Ms      float64           `json:"ttft_p50_ms"`
	TTFTP99Ms      float64           `json:"ttft_p99_ms"`
	Faults         []FaultReport     `json:"faults"`
	HeapMaxMiB     float64           `json:"heap_max_mib"`
	SysMiB         float64           `json:"sys_mib"`
	Goroutines     int               `json:"goroutines_after"`
	LoadAverage    string            `json:"load_average"`
	LeakedLoad     map[string]int    `json:"leaked_load"` // pool → requests still counted
	ErrorsByPool   map[string]int    `json:"errors_by_pool"`
	StatusesByPool map[string]statc  `json:"statuses_by_pool"`
	// Accounting is set by Config.Accounting.
	Accounting *AccountingReport `json:"accounting,omitempty"`
}

type statc map[string]int

// FaultReport is one injected fault.
type FaultReport struct {
	Fault string `json:"fault"`
	// AtSeconds is when it was injected, from the start of the traffic.
	AtSeconds   float64 `json:"at_seconds"`
	DownSeconds float64 `json:"down_seconds"`
	// RecoverySeconds is from the restart until a request to the affected
	// pool (every pool for NATS and etcd) succeeded again.
	RecoverySeconds float64        `json:"recovery_seconds"`
	Requests        int            `json:"requests"` // started while it was down
	Errors          map[string]int `json:"errors"`   // of those, by reason
	Err             string         `json:"error,omitempty"`
}

// result is one request's outcome.
type result struct {
	start   time.Time
	latency time.Duration
	ttft    time.Duration
	status  int
	pool    string
	reason  string // "" when it succeeded
	message string // the error body's message, for Samples
}

// Run starts the system, drives the traffic and the faults, stops the
// system and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	d := DefaultConfig()
	config.PositiveOr(&cfg.Streams, d.Streams)
	config.PositiveOr(&cfg.Duration, d.Duration)
	config.PositiveOr(&cfg.Hold, d.Hold)
	config.PositiveOr(&cfg.MaxTokens, d.MaxTokens)
	config.PositiveOr(&cfg.RequestTimeout, d.RequestTimeout)
	for _, k := range cfg.Kill {
		switch k {
		case FaultRouter, FaultWorker, FaultNATS, FaultEtcd:
		default:
			return nil, fmt.Errorf("chaos: unknown fault %q (want router, worker, nats or etcd)", k)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ucfg := cfg.Up
	ucfg.OnLoopback()
	ucfg.Logger = cfg.Logger
	var rec *recorder
	if cfg.Accounting {
		rec = newRecorder()
		ucfg.Observers = rec.observers()
	}
	sys, err := up.Start(ctx, ucfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sys.CloseWithin(30 * time.Second) }()
	if sys.Pool("pool-a") == nil && len(cfg.Kill) > 0 {
		return nil, errors.New("chaos: the system has no pool-a to inject faults into")
	}

	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Streams + 16, MaxConnsPerHost: 0, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	model := ucfg.Model
	if model == "" {
		model = up.DefaultConfig().Model
	}

	var mu sync.Mutex
	var results []result
	actx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	var sampled <-chan []up.AccountingSample
	if cfg.Accounting {
		sampled = sampleAccounting(actx, sys)
	}
	start := time.Now()
	trafficCtx, stopTraffic := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer stopTraffic()

	var mem memSampler
	memDone := make(chan struct{})
	go mem.run(trafficCtx, memDone)

	var wg sync.WaitGroup
	for i := range cfg.Streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for n := 0; trafficCtx.Err() == nil; n++ {
				// Each request's own id, by which -accounting joins what
				// the routers and the engines saw of it.
				id := fmt.Sprintf("chaos-%d-%d", i, n)
				res := oneRequest(trafficCtx, client, sys.GatewayURL(), model, prompt(rng), cfg.MaxTokens, cfg.RequestTimeout, "x-request-id", id)
				rec.clientDone(id, res.start.Add(res.latency))
				if trafficCtx.Err() != nil && res.reason != "" {
					break // cut off by the end of the run, not a failure
				}
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
				if res.reason != "" && cfg.ErrorPause > 0 {
					select {
					case <-trafficCtx.Done():
					case <-time.After(cfg.ErrorPause):
					}
				}
			}
		}()
	}

	faults := runFaults(trafficCtx, sys, client, model, cfg, start)
	wg.Wait()
	<-memDone
	traffic := time.Since(start)

	rep := &Report{
		Streams: cfg.Streams, DurationSeconds: traffic.Seconds(), Errors: map[string]int{}, Samples: map[string]string{},
		Faults: faults, LeakedLoad: map[string]int{}, ErrorsByPool: map[string]int{}, StatusesByPool: map[string]statc{},
	}
	var lat, ttft []time.Duration
	for _, r := range results {
		rep.Requests++
		ps := rep.StatusesByPool[orNone(r.pool)]
		if ps == nil {
			ps = statc{}
			rep.StatusesByPool[orNone(r.pool)] = ps
		}
		ps[fmt.Sprint(r.status)]++
		if r.reason == "" {
			rep.OK++
			lat = append(lat, r.latency)
			ttft = append(ttft, r.ttft)
		} else {
			rep.Errors[r.reason]++
			if _, ok := rep.Samples[r.reason]; !ok && r.message != "" {
				rep.Samples[r.reason] = r.message
			}
			rep.ErrorsByPool[orNone(r.pool)]++
			if r.reason == "hung" {
				rep.Hung++
			}
		}
		for i := range rep.Faults {
			f := &rep.Faults[i]
			at := start.Add(time.Duration(f.AtSeconds * float64(time.Second)))
			end := at.Add(time.Duration((f.DownSeconds + f.RecoverySeconds) * float64(time.Second)))
			if !r.start.Before(at) && r.start.Before(end) {
				f.Requests++
				if r.reason != "" {
					f.Errors[r.reason]++
				}
			}
		}
	}
	rep.LatencyP50Ms, rep.LatencyP99Ms = ms(pct(lat, 50)), ms(pct(lat, 99))
	rep.TTFTP50Ms, rep.TTFTP99Ms = ms(pct(ttft, 50)), ms(pct(ttft, 99))

	// Leaked load: once the traffic is over, every router's in-flight
	// count must come back to 0 (a stream's end frees it at once; allow
	// the last frees a moment to land).
	deadline := time.Now().Add(10 * time.Second)
	for {
		leaked := 0
		for _, p := range sys.Pools {
			if !p.RouterStopped() {
				rep.LeakedLoad[p.Name] = p.Requests()
				leaked += rep.LeakedLoad[p.Name]
			}
		}
		if leaked == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	if sampled != nil {
		stopSampling()
		rep.Accounting = accountingReport(sys, rec, <-sampled, start.Add(traffic))
	}
	rep.HeapMaxMiB = float64(mem.maxHeap) / (1 << 20)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.SysMiB = float64(ms.Sys) / (1 << 20)
	rep.Goroutines = runtime.NumGoroutine()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.LoadAverage = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return rep, nil
}

// runFaults injects cfg.Kill in turn, evenly spaced over the run: the part
// goes down for cfg.Hold, comes back, and the recovery is timed with
// requests to the affected pool.
func runFaults(ctx context.Context, sys *up.System, c *http.Client, model string, cfg Config, start time.Time) []FaultReport {
	var out []FaultReport
	slot := cfg.Duration / time.Duration(len(cfg.Kill)+1)
	pa := sys.Pool("pool-a")
	for i, k := range cfg.Kill {
		at := start.Add(slot * time.Duration(i+1))
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil {
			// An earlier fault's recovery ran past this one's slot.
			out = append(out, FaultReport{Fault: k, Errors: map[string]int{}, Err: "not run: the run ended first"})
			continue
		}
		f := FaultReport{Fault: k, AtSeconds: time.Since(start).Seconds(), Errors: map[string]int{}}
		down := time.Now()
		var restart func(context.Context) error
		switch k {
		case FaultRouter:
			_ = pa.StopRouter(ctx)
			restart = pa.RestartRouter
		case FaultWorker:
			pa.Workers[0].Kill()
			restart = pa.Workers[0].Restart
		case FaultNATS:
			sys.StopNATS()
			restart = sys.RestartNATS
		case FaultEtcd:
			sys.StopEtcd()
			restart = sys.RestartEtcd
		}
		select {
		case <-ctx.Done():
		case <-time.After(cfg.Hold):
		}
		// Bring the part back even when the run is over, so Close is clean.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		if err := restart(rctx); err != nil {
			f.Err = "restart: " + err.Error()
		}
		cancel()
		f.DownSeconds = time.Since(down).Seconds()
		back := time.Now()
		pools := []string{"pool-a"}
		if k == FaultNATS || k == FaultEtcd {
			pools = pools[:0]
			for _, p := range sys.Pools {
				pools = append(pools, p.Name)
			}
		}
		// Recovery is timed until the next fault's slot at most: the
		// schedule holds whatever a fault does.
		pctx, cancel := context.WithDeadline(ctx, start.Add(slot*time.Duration(i+2)))
		recovered := true
		for _, p := range pools {
			for {
				r := oneRequest(pctx, c, sys.GatewayURL(), model, "recovery probe", 2, 5*time.Second, "x-kvgate-pool", p)
				if r.reason == "" {
					break
				}
				if pctx.Err() != nil {
					recovered = false
					break
				}
				time.Sleep(20 * time.Millisecond) // polling interval
			}
		}
		cancel()
		f.RecoverySeconds = time.Since(back).Seconds()
		if !recovered {
			f.Err = fmt.Sprintf("not recovered within %.1f s", f.RecoverySeconds)
		}
		out = append(out, f)
	}
	return out
}

// oneRequest sends one streamed chat completion and reads it to the end.
func oneRequest(ctx context.Context, c *http.Client, base, model, content string, maxTokens int, timeout time.Duration, hdr ...string) result {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res := result{start: time.Now()}
	req, err := http.NewRequestWithContext(rctx, "POST", base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		res.reason = "build request"
		return res
	}
	req.Header.Set("content-type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		res.reason = transportReason(rctx, ctx, err, "before response")
		res.latency = time.Since(res.start)
		return res
	}
	defer resp.Body.Close()
	res.status, res.pool = resp.StatusCode, resp.Header.Get("x-kvgate-pool")
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		why := resp.Header.Get("x-kvgate-dropped-reason")
		if why == "" {
			why = firstWords(string(b))
		}
		res.reason = fmt.Sprintf("%d %s", resp.StatusCode, why)
		res.message = errorMessage(string(b))
		res.latency = time.Since(res.start)
		return res
	}
	br := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := br.ReadString('\n')
		if res.ttft == 0 && strings.HasPrefix(line, "data: ") {
			res.ttft = time.Since(res.start)
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			done = true
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.reason = transportReason(rctx, ctx, err, "mid-stream")
			} else if !done {
				res.reason = "stream ended without [DONE]"
			}
			break
		}
	}
	res.latency = time.Since(res.start)
	return res
}

func transportReason(rctx, parent context.Context, err error, where string) string {
	switch {
	case parent.Err() != nil:
		return "cut off by the end of the run"
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return "hung"
	case strings.Contains(err.Error(), "connection refused"):
		return "connection refused " + where
	case strings.Contains(err.Error(), "reset"), strings.Contains(err.Error(), "EOF"):
		return "reset " + where
	}
	return "transport error " + where
}

// errorMessage is an error body's message (OpenAI-shaped or plain text),
// cut to a few hundred bytes.
func errorMessage(s string) string {
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	if json.Unmarshal([]byte(s), &e) == nil && e.Error.Message != "" {
		s = e.Error.Message
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func firstWords(s string) string {
	s = strings.TrimSpace(s)
	var e struct {
		Error struct{ Code any } `json:"error"`
	}
	if json.Unmarshal([]byte(s), &e) == nil && e.Error.Code != nil {
		return fmt.Sprint(e.Error.Code)
	}
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

// prompt is one of a few shared system prefixes and a varying question,
// so the cache and the routing matter.
func prompt(rng *rand.Rand) string {
	var b strings.Builder
	topic := rng.IntN(16)
	for i := range 24 {
		fmt.Fprintf(&b, "Section %d of handbook %d explains how a cached prefix saves prefill work. ", i, topic)
	}
	fmt.Fprintf(&b, "Question %d: what follows?", rng.IntN(1000))
	return b.String()
}

type memSampler struct{ maxHeap uint64 }

func (m *memSampler) run(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		m.maxHeap = max(m.maxHeap, ms.HeapAlloc)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "chaos: %d streams for %.0f s through the gateway; load average %s\n", r.Streams, r.DurationSeconds, r.LoadAverage)
	fmt.Fprintf(w, "requests %d, ok %d, errors %d, hung %d\n", r.Requests, r.OK, r.Requests-r.OK, r.Hung)
	fmt.Fprintf(w, "latency p50 %.1f ms, p99 %.1f ms; time to first token p50 %.1f ms, p99 %.1f ms\n", r.LatencyP50Ms, r.LatencyP99Ms, r.TTFTP50Ms, r.TTFTP99Ms)
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "errors by reason:")
		for _, k := range sortedKeys(r.Errors) {
			fmt.Fprintf(w, "  %-48s %d\n", k, r.Errors[k])
			if m := r.Samples[k]; m != "" {
				fmt.Fprintf(w, "    e.g. %q\n", m)
			}
		}
	}
	fmt.Fprintln(w, "statuses by pool:")
	for _, p := range sortedKeys(r.StatusesByPool) {
		fmt.Fprintf(w, "  %-12s", p)
		for _, s := range sortedKeys(r.StatusesByPool[p]) {
			fmt.Fprintf(w, " %s×%d", s, r.StatusesByPool[p][s])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-8s %8s %8s %10s %9s  %s\n", "fault", "at (s)", "down (s)", "recovery", "requests", "errors while down or recovering")
	for _, f := range r.Faults {
		var errs []string
		for _, k := range sortedKeys(f.Errors) {
			errs = append(errs, fmt.Sprintf("%s×%d", k, f.Errors[k]))
		}
		if f.Err != "" {
			errs = append(errs, f.Err)
		}
		fmt.Fprintf(w, "%-8s %8.1f %8.1f %9.2fs %9d  %s\n", f.Fault, f.AtSeconds, f.DownSeconds, f.RecoverySeconds, f.Requests, strings.Join(errs, ", "))
	}
	fmt.Fprintf(w, "memory: heap max %.0f MiB, runtime total %.0f MiB; goroutines at the end of the traffic (system still up) %d\n", r.HeapMaxMiB, r.SysMiB, r.Goroutines)
	fmt.Fprintf(w, "leaked load (requests every local router still counts after the run; must be 0): %v\n", r.LeakedLoad)
	if r.Accounting != nil {
		r.Accounting.print(w)
	}
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
