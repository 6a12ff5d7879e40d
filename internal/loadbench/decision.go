package loadbench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/lib/config"
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
	// Commit is the global router's probe.commit (default: the probe
	// configuration's, else decide); ProbeFile a YAML file of the global
	// router's probe section (LoadProbeConfig; "": the defaults).
	Commit    globalrouter.CommitMode
	ProbeFile string
	// Sequential is how many exchanges run one at a time before the paced
	// window (default 300): the decision's parts are measured on them —
	// tokenizing, the round trips to the local routers, the gRPC floor.
	Sequential int
	Logger     *slog.Logger // progress; nil: none
}

// DecisionResult is the decision benchmark's figures for one commit mode
// and one shape of pools.
//
// The sequential phase (one exchange at a time, Sequential of them):
// Decision is the global router's decision alone, timed around its Decide
// inside the ext_proc server; Tokenize the tokenizer's share of it, timed
// around the global router's tokenizer; GRPCFloor a bare gRPC round trip
// of ProbeBytes (the largest probe sent) on the local routers' transport,
// in kvgate's process, one after each exchange; RoundTripsPerDecision the mean of
// each decision's round trips to the local routers that it waited for,
// counted on the wire (rtCounter), and UnwaitedPerDecision the messages
// it sent without waiting (a pipelined commit); TargetDecisionP50us is
// issue 26's bound, tokenize p50 + 1.3 × floor p50.
//
// The paced phase (Rate requests per second, N of them): Exchange is the
// whole exchange as the client times it (headers and body out, the
// routing headers back), PacedDecision the decisions, MessagesPerRequest
// the messages sent to the local routers per request by kind (frees
// included), CPU per request of the client's and kvgate's process (one
// process: ClientCPUusPerReq is the whole, ServerCPUusPerReq 0).
type DecisionResult struct {
	Commit      string `json:"commit"`
	Pools       int    `json:"pools"`
	Workers     int    `json:"workers_per_pool"`
	LoadAverage string `json:"load_average"`

	Sequential     int     `json:"sequential"`
	DecisionP50us  float64 `json:"decision_p50_us"`
	DecisionP99us  float64 `json:"decision_p99_us"`
	TokenizeP50us  float64 `json:"tokenize_p50_us"`
	TokenizeP99us  float64 `json:"tokenize_p99_us"`
	GRPCFloorP50us float64 `json:"grpc_floor_p50_us"`
	GRPCFloorP99us float64 `json:"grpc_floor_p99_us"`
	// GRPCFloorBackToBackP50us is the floor's round trips run one after
	// the other with no pause (the process never idles between them).
	GRPCFloorBackToBackP50us float64 `json:"grpc_floor_back_to_back_p50_us"`
	ProbeBytes               int     `json:"probe_bytes"`
	RoundTripsPerDecision    float64 `json:"round_trips_per_decision"`
	UnwaitedPerDecision      float64 `json:"unwaited_messages_per_decision"`
	TargetDecisionP50us      float64 `json:"target_decision_p50_us"`
	TargetMet                bool    `json:"target_met"`

	Requests           int                `json:"requests"`
	Errors             int                `json:"errors"`
	Rate               float64            `json:"rate"`
	ExchangeP50us      float64            `json:"exchange_p50_us"`
	ExchangeP99us      float64            `json:"exchange_p99_us"`
	PacedDecisionP50us float64            `json:"paced_decision_p50_us"`
	PacedDecisionP99us float64            `json:"paced_decision_p99_us"`
	MessagesPerRequest map[string]float64 `json:"messages_per_request"`
	// BestEffort is the paced requests routed with no local router's
	// answer (every probe past its deadline: no probe result, no commit;
	// an overloaded machine's mark).
	BestEffort        int     `json:"best_effort"`
	ClientCPUusPerReq float64 `json:"client_cpu_us_per_req"`
	ServerCPUusPerReq float64 `json:"server_cpu_us_per_req"`
	ServerProcess     bool    `json:"server_process"`
	// CPUvsDecide is this run's kvgate CPU per request over the decide
	// run's of the same pools in the same invocation (DecisionModes; 0:
	// none; issue 26 wants reserve ≤ 0.75).
	CPUvsDecide float64 `json:"kvgate_cpu_vs_decide,omitempty"`
}

// decisionServerEnv marks the process Decision starts with ServerProcess;
// decisionServerProfileEnv names its profile's file.
const (
	decisionServerEnv        = config.EnvDecisionServer
	decisionServerProfileEnv = config.EnvDecisionServerProfile
	decisionCommitEnv        = config.EnvDecisionCommit
	decisionProbeFileEnv     = config.EnvDecisionProbeFile
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
	if c.Sequential <= 0 {
		c.Sequential = 300
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
// connect to the worker); beside them the gRPC floor's server.
type decisionSide struct {
	addr  string
	timed *timedDecider
	tok   *timedTokenizer
	rt    *rtCounter
	floor *floorServer
	reg   *prometheus.Registry // the global router's metrics
	stop  func()
}

// timedDecider records each decision's duration inside the ext_proc
// server, and, while seq is set (decisions one at a time), brackets each
// with rt's begin and end.
type timedDecider struct {
	d   globalrouter.Decider
	rt  *rtCounter
	seq atomic.Bool
	mu  sync.Mutex
	lat []time.Duration
}

func (t *timedDecider) Decide(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
	seq := t.seq.Load()
	if seq {
		t.rt.begin()
	}
	t0 := time.Now()
	d, err := t.d.Decide(ctx, req)
	el := time.Since(t0)
	if seq {
		t.rt.end()
	}
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

// sideConfig is what kvgate's side is built from (in a child process: its
// environment).
type sideConfig struct {
	pools, workers int
	commit         globalrouter.CommitMode
	probeFile      string
}

// probeConfig is the global router's probe configuration: the file's (or
// the defaults), with commit's mode if set.
func (sc sideConfig) probeConfig() (globalrouter.ProbeConfig, error) {
	var p globalrouter.ProbeConfig
	if sc.probeFile != "" {
		var err error
		if p, err = LoadProbeConfig(sc.probeFile); err != nil {
			return p, err
		}
	}
	if sc.commit != "" {
		p.Commit = sc.commit
	}
	return p, nil
}

func startDecisionSide(sc sideConfig) (_ *decisionSide, err error) {
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
	probe, err := sc.probeConfig()
	if err != nil {
		return nil, err
	}
	const blockSize = 16
	var pcs []pool.Config
	for p := range sc.pools {
		name := fmt.Sprintf("pool-%d", p)
		lr, err := pooltest.Serve("127.0.0.1:0", name, blockSize, pooltest.Workers(name, sc.workers)...)
		if err != nil {
			return nil, err
		}
		stops = append(stops, lr.Close)
		pcs = append(pcs, pool.NewConfig(name, blockSize, []string{decisionModel}, lr.Addr))
	}
	floor, err := startFloor()
	if err != nil {
		return nil, err
	}
	stops = append(stops, floor.stop)
	tok, err := loadDecisionTokenizer()
	if err != nil {
		return nil, err
	}
	ds := &decisionSide{tok: &timedTokenizer{t: tok}, rt: newRTCounter(), floor: floor}
	gcfg := globalrouter.DefaultConfig(pcs...)
	gcfg.Probe = probe
	gcfg.Defaults()
	ds.reg = prometheus.NewRegistry()
	router, err := globalrouter.New(gcfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)), globalrouter.WithRegisterer(ds.reg),
		globalrouter.WithTokenizer(decisionModel, ds.tok), globalrouter.WithDialer(pool.ChannelDialer(ds.rt.dialOptions()...)))
	if err != nil {
		return nil, err
	}
	stops = append(stops, func() { router.Close() })
	ds.timed = &timedDecider{d: router, rt: ds.rt}
	xs, err := extproc.New(extproc.Config{}, ds.timed, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
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
	ds.addr, ds.stop = lis.Addr().String(), stop
	return ds, nil
}

// decisionModel is the model the benchmark's pools serve and its requests
// name.
const decisionModel = "m"

// serverSnapshot is what kvgate's side reports to a command: its CPU
// time so far and what it recorded since the previous snapshot.
type serverSnapshot struct {
	CPUns      int64            `json:"cpu_ns"`
	Decisions  []int64          `json:"decisions_ns"`
	Tokenize   []int64          `json:"tokenize_ns"`
	Rounds     []int            `json:"rounds"`
	Unwaited   []int            `json:"unwaited"`
	Sent       map[string]int64 `json:"sent"`
	ProbeBytes int              `json:"probe_bytes"`
	Floor      []int64          `json:"floor_ns"`
	// BestEffort is the decisions so far routed with no local router's
	// answer (kvgate_globalrouter_best_effort_total: every probe missed
	// its deadline; no commit).
	BestEffort int `json:"best_effort"`
}

func nanos(ds []time.Duration) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.Nanoseconds()
	}
	return out
}

func durations(ns []int64) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n)
	}
	return out
}

// command runs one of the commands the benchmark drives kvgate's side
// with: "snap" (a snapshot), "seq 1" / "seq 0" (decisions one at a time
// from now / no longer: count their round trips), "floor N" (N bare gRPC
// round trips of the largest probe's size: a snapshot of only them, in
// Floor, and the CPU time).
func (ds *decisionSide) command(cmd string) (serverSnapshot, error) {
	switch f := strings.Fields(cmd); {
	case len(f) == 2 && f[0] == "seq":
		ds.timed.seq.Store(f[1] == "1")
	case len(f) == 2 && f[0] == "floor":
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return serverSnapshot{}, fmt.Errorf("command %q: %w", cmd, err)
		}
		floor, err := ds.floor.measure(context.Background(), n, ds.rt.probeSize())
		if err != nil {
			return serverSnapshot{}, err
		}
		return serverSnapshot{CPUns: CPUTime().Nanoseconds(), Floor: nanos(floor)}, nil // the rest stays for the next snapshot
	case cmd == "snap":
	default:
		return serverSnapshot{}, fmt.Errorf("unknown command %q", cmd)
	}
	s := serverSnapshot{CPUns: CPUTime().Nanoseconds(), Decisions: nanos(ds.timed.take()), Tokenize: nanos(ds.tok.take())}
	s.Rounds, s.Unwaited = ds.rt.takeSeq()
	s.Sent, s.ProbeBytes = ds.rt.takeSent()
	var err error
	s.BestEffort, err = gatherSum(ds.reg, "kvgate_globalrouter_best_effort_total", "", "")
	return s, err
}

// serveDecisionServer is the decision benchmark's server process: it
// prints "addr <ext_proc address>", then answers each line of its
// input (a command) with "snap <json serverSnapshot>", until its input
// closes. With a profile file it profiles its CPU from the first "snap"
// (the start of the paced window) to the second.
func serveDecisionServer(in io.Reader, out io.Writer, profile string) error {
	ds, err := startDecisionSide(sideConfig{pools: intEnv(config.EnvDecisionPools, 2), workers: intEnv(config.EnvDecisionWorkers, 8),
		commit: globalrouter.CommitMode(os.Getenv(decisionCommitEnv)), probeFile: os.Getenv(decisionProbeFileEnv)})
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
	for n := 0; lines.Scan(); {
		s, err := ds.command(lines.Text())
		if err != nil {
			return err
		}
		b, _ := json.Marshal(s)
		switch {
		case profile == "" || lines.Text() != "snap":
		case n == 0:
			if stopProfile, err = startCPUProfile(profile); err != nil {
				return err
			}
			n++
		case n == 1:
			stopProfile()
			stopProfile = func() {}
			n++
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
