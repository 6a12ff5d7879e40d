package loadbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/benchfig"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// DecisionConfig is the paced decision benchmark (`kvgate bench
// -decision`): Envoy's side of the ext_proc exchange (the Envoy-faithful
// client, full-duplex streamed request bodies as the shipped bootstrap
// sends them) offered open-loop at Rate requests per second against
// kvgate's side (decisionSide: the ext_proc server, the global router and
// Pools local routers of Workers workers each), N requests of an 8 KB
// chat body each, every one distinct.
type DecisionConfig struct {
	Rate, N        int // default 1000/s, 3000
	Pools, Workers int // default 2 × 8
	// ServerProcess runs kvgate's side in a child process (this binary
	// re-executed; its main must call ServeChild first), as a real Envoy
	// would be a process of its own: each side's CPU and heap apart, so
	// the client's garbage collections do not stall the router's. Off,
	// both sides share this process.
	ServerProcess bool
	// ServerProfile, with ServerProcess, is a file the server process
	// writes a CPU profile of the paced window to ("": none).
	ServerProfile string
	Logger        *slog.Logger // progress; nil: none
}

// DecisionResult is the paced decision benchmark's figures. Exchange is the
// whole exchange as the client times it (headers and body out, the
// routing headers back); Decision is the global router's decision alone,
// timed around its Decide inside the ext_proc server; CPU is per request,
// of the client's and kvgate's process (one process: ClientCPUusPerReq is
// the whole, ServerCPUusPerReq 0).
type DecisionResult struct {
	Requests          int     `json:"requests"`
	Errors            int     `json:"errors"`
	Rate              float64 `json:"rate"`
	ExchangeP50us     float64 `json:"exchange_p50_us"`
	ExchangeP99us     float64 `json:"exchange_p99_us"`
	DecisionP50us     float64 `json:"decision_p50_us"`
	DecisionP99us     float64 `json:"decision_p99_us"`
	ClientCPUusPerReq float64 `json:"client_cpu_us_per_req"`
	ServerCPUusPerReq float64 `json:"server_cpu_us_per_req"`
	ServerProcess     bool    `json:"server_process"`
}

// decisionServerEnv marks the process Decision starts with ServerProcess;
// decisionServerProfileEnv names its profile's file.
const (
	decisionServerEnv        = "KVGATE_DECISION_SERVER"
	decisionServerProfileEnv = "KVGATE_DECISION_SERVER_PROFILE"
)

func (c *DecisionConfig) defaults() {
	if c.Rate <= 0 {
		c.Rate = 1000
	}
	if c.N <= 0 {
		c.N = 3000
	}
	if c.Pools <= 0 {
		c.Pools = 2
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// decisionSide is kvgate's side of the decision benchmark: the shape of
// extproc's BenchmarkDecision (the "2 pools x 8 workers"), pools
// of local routers on loopback gRPC with the production transport
// (pooltest.Serve, the routers extproc's benchmark runs), the
// global router (the default chain and tokenizer) and the ext_proc server,
// without etcd, NATS or workers (the exchange ends when Envoy would
// connect to the worker).
type decisionSide struct {
	addr  string
	timed *timedDecider
	stop  func()
}

// timedDecider records each decision's duration inside the ext_proc server.
type timedDecider struct {
	d   globalrouter.Decider
	mu  sync.Mutex
	lat []time.Duration
}

func (t *timedDecider) Decide(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
	t0 := time.Now()
	d, err := t.d.Decide(ctx, req)
	el := time.Since(t0)
	t.mu.Lock()
	t.lat = append(t.lat, el)
	t.mu.Unlock()
	return d, err
}

// take returns the durations recorded since the last take.
func (t *timedDecider) take() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.lat
	t.lat = nil
	return out
}

func startDecisionSide(pools, workers int) (_ *decisionSide, err error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	const blockSize = 16
	var pcs []pool.Config
	for p := range pools {
		name := fmt.Sprintf("pool-%d", p)
		lr, err := pooltest.Serve("127.0.0.1:0", name, blockSize, pooltest.Workers(name, workers)...)
		if err != nil {
			return nil, err
		}
		stops = append(stops, lr.Close)
		pcs = append(pcs, pool.NewConfig(name, blockSize, []string{decisionModel}, lr.Addr))
	}
	gcfg := globalrouter.DefaultConfig(pcs...)
	router, err := globalrouter.New(gcfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, err
	}
	stops = append(stops, func() { router.Close() })
	timed := &timedDecider{d: router}
	xs, err := extproc.New(extproc.Config{}, timed, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- xs.Serve(ctx, lis) }()
	stops = append(stops, func() { cancel(); <-done })
	return &decisionSide{addr: lis.Addr().String(), timed: timed, stop: stop}, nil
}

// decisionModel is the model the benchmark's pools serve and its requests
// name.
const decisionModel = "m"

// serverSnapshot is what kvgate's side reports at the start and the end
// of the paced window: its CPU time so far and the decisions' durations
// since the previous snapshot.
type serverSnapshot struct {
	CPUns     int64   `json:"cpu_ns"`
	Decisions []int64 `json:"decisions_ns"`
}

func (ds *decisionSide) snapshot() serverSnapshot {
	s := serverSnapshot{CPUns: CPUTime().Nanoseconds()}
	for _, d := range ds.timed.take() {
		s.Decisions = append(s.Decisions, d.Nanoseconds())
	}
	return s
}

// serveDecisionServer is the decision benchmark's server process: it
// prints "addr <ext_proc address>", then answers each line of its
// input with "snap <json serverSnapshot>", until its input closes. With a
// profile file it profiles its CPU from the first snapshot (the start of
// the paced window) to the second.
func serveDecisionServer(in io.Reader, out io.Writer, profile string) error {
	ds, err := startDecisionSide(intEnv("KVGATE_DECISION_POOLS", 2), intEnv("KVGATE_DECISION_WORKERS", 8))
	if err != nil {
		return err
	}
	defer ds.stop()
	if _, err := fmt.Fprintf(out, "addr %s\n", ds.addr); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	stopProfile := func() {}
	defer func() { stopProfile() }() // if the input closes first
	for n := 0; lines.Scan(); n++ {
		b, _ := json.Marshal(ds.snapshot())
		switch {
		case profile == "":
		case n == 0:
			if stopProfile, err = startCPUProfile(profile); err != nil {
				return err
			}
		case n == 1:
			stopProfile()
			stopProfile = func() {}
		}
		if _, err := fmt.Fprintf(out, "snap %s\n", b); err != nil {
			return err
		}
	}
	return lines.Err()
}

func intEnv(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err != nil || n <= 0 {
		return def
	}
	return n
}

// Decision runs the paced decision benchmark.
func Decision(ctx context.Context, cfg DecisionConfig) (DecisionResult, error) {
	cfg.defaults()
	var (
		addr string
		snap func() (serverSnapshot, error)
	)
	if cfg.ServerProcess {
		ps, err := startChild(ctx, "decision bench", decisionServerEnv+"=1", decisionServerProfileEnv+"="+cfg.ServerProfile,
			fmt.Sprintf("KVGATE_DECISION_POOLS=%d", cfg.Pools), fmt.Sprintf("KVGATE_DECISION_WORKERS=%d", cfg.Workers))
		if err != nil {
			return DecisionResult{}, err
		}
		defer ps.stop()
		addr = ps.addr
		snap = func() (serverSnapshot, error) {
			var s serverSnapshot
			if _, err := io.WriteString(ps.in, "snap\n"); err != nil {
				return s, fmt.Errorf("decision bench: server process: %w", err)
			}
			line, err := ps.line()
			if err != nil {
				return s, fmt.Errorf("decision bench: server process: %w", err)
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "snap ")), &s); err != nil {
				return s, fmt.Errorf("decision bench: server process: %.80q: %w", line, err)
			}
			return s, nil
		}
	} else {
		ds, err := startDecisionSide(cfg.Pools, cfg.Workers)
		if err != nil {
			return DecisionResult{}, err
		}
		defer ds.stop()
		addr = ds.addr
		snap = func() (serverSnapshot, error) { return ds.snapshot(), nil }
	}
	cfg.Logger.Info("decision bench: kvgate's side is up", "ext_proc", addr, "server_process", cfg.ServerProcess)

	conn, err := grpc.NewClient(addr, append(extprocclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return DecisionResult{}, fmt.Errorf("decision bench: %w", err)
	}
	defer conn.Close()
	client, err := extprocclient.New(conn, extprocclient.Config{
		ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND,
			ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseTrailerMode: extprocfilterv3.ProcessingMode_SEND,
		},
		ReceivingNamespaces: []string{"envoy.lb"},
		MessageTimeout:      10 * time.Second,
		BufferLimit:         32 << 20,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		return DecisionResult{}, fmt.Errorf("decision bench: %w", err)
	}
	for i := range 32 { // warm the connections, the tokenizer, the caches
		if _, err := decisionExchange(ctx, client, decisionBody("warm", i)); err != nil {
			return DecisionResult{}, fmt.Errorf("decision bench: warm-up: %w", err)
		}
	}
	bodies := make([][]byte, cfg.N)
	for i := range bodies {
		bodies[i] = decisionBody("paced", i)
	}
	s0, err := snap()
	if err != nil {
		return DecisionResult{}, err
	}
	cpu0 := CPUTime()
	lat := make([]time.Duration, cfg.N)
	errs := make([]error, cfg.N)
	var wg sync.WaitGroup
	gap := time.Second / time.Duration(cfg.Rate)
	t0 := time.Now()
	for i := range cfg.N {
		if d := time.Until(t0.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d) // pacing the offered load
		}
		wg.Go(func() { lat[i], errs[i] = decisionExchange(ctx, client, bodies[i]) })
	}
	wg.Wait()
	elapsed := time.Since(t0)
	cpu := CPUTime() - cpu0
	s1, err := snap()
	if err != nil {
		return DecisionResult{}, err
	}
	res := DecisionResult{Requests: cfg.N, Rate: float64(cfg.N) / elapsed.Seconds(), ServerProcess: cfg.ServerProcess}
	var ok []time.Duration
	var firstErr error
	for i, e := range errs {
		if e != nil {
			res.Errors++
			if firstErr == nil {
				firstErr = e
			}
			continue
		}
		ok = append(ok, lat[i])
	}
	p := benchfig.Percentiles(ok)
	res.ExchangeP50us, res.ExchangeP99us = float64(p.P50.Nanoseconds())/1e3, float64(p.P99.Nanoseconds())/1e3
	dec := make([]time.Duration, len(s1.Decisions))
	for i, ns := range s1.Decisions {
		dec[i] = time.Duration(ns)
	}
	dp := benchfig.Percentiles(dec)
	res.DecisionP50us, res.DecisionP99us = float64(dp.P50.Nanoseconds())/1e3, float64(dp.P99.Nanoseconds())/1e3
	res.ClientCPUusPerReq = float64(cpu.Nanoseconds()) / 1e3 / float64(cfg.N)
	if cfg.ServerProcess {
		res.ServerCPUusPerReq = float64(s1.CPUns-s0.CPUns) / 1e3 / float64(cfg.N)
	}
	if res.Errors > 0 {
		return res, fmt.Errorf("decision bench: %d of %d exchanges failed, the first: %w", res.Errors, cfg.N, firstErr)
	}
	return res, nil
}

// decisionBody is the benchmark's 8 KB chat body: a system line that makes
// each request distinct, then one long user message.
func decisionBody(series string, i int) []byte {
	b, _ := json.Marshal(map[string]any{"model": decisionModel, "stream": true, "messages": []map[string]string{
		{"role": "system", "content": fmt.Sprintf("%s %d: you are a helpful assistant.", series, i)},
		{"role": "user", "content": decisionParagraph},
	}})
	return b
}

var decisionParagraph = func() string {
	var para strings.Builder
	for i := 0; para.Len() < 7800; i++ {
		fmt.Fprintf(&para, "Paragraph %d: a router that knows which worker holds a prompt's prefix in its KV cache saves the prefill of that prefix. ", i)
	}
	return para.String()
}()

// decisionExchange runs one request through the ext_proc server up to its
// release towards the upstream (what Envoy waits for before connecting to
// the worker), then ends the stream, which frees the request.
func decisionExchange(ctx context.Context, c *extprocclient.Client, body []byte) (time.Duration, error) {
	start := time.Now()
	s := c.Open(ctx, nil)
	defer s.Close()
	hdr := extprocclient.Headers{
		{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
		{Key: ":authority", Value: "gateway.local"}, {Key: ":scheme", Value: "http"},
		{Key: "content-type", Value: "application/json"},
	}
	if err := s.SendRequestHeaders(ctx, hdr, false); err != nil {
		return 0, err
	}
	if err := s.SendRequestData(ctx, body, true); err != nil {
		return 0, err
	}
	routed := false
	for {
		f, err := s.ReadUpstream(ctx)
		switch {
		case errors.Is(err, io.EOF):
			if !routed {
				return 0, errors.New("request released without a destination")
			}
			return time.Since(start), nil
		case errors.Is(err, extprocclient.ErrLocalReply):
			lr := s.Info().LocalReply
			return 0, fmt.Errorf("local reply %d %s", lr.Status, lr.Body)
		case err != nil:
			return 0, err
		}
		if f.Kind == extprocclient.FrameHeaders {
			_, routed = f.Headers.Get("x-gateway-destination-endpoint")
		}
	}
}
