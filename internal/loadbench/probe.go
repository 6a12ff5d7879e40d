// Package loadbench is `kvgate bench`'s load figures (BENCHMARKS.md,
// "Performance"): the side-by-side probe benchmark (the local-router
// Channel against today's unary BestWorker, on the same ≈1M-entry index in
// one run), the paced decision benchmark (Decision: Envoy's side of the
// ext_proc exchange against kvgate's, each in its own process) and the
// soak (thousands of concurrent streaming requests through the ext_proc
// server and the Envoy-faithful client to mock workers, then every
// router's in-flight count back to 0). Both ends run in this process,
// so CPU figures (getrusage) count client and server together, unless a
// benchmark's server runs in its own process (ProbeConfig.ServerProcess,
// DecisionConfig.ServerProcess), which measures each end apart.
//
// The active-active burst (ActiveActive, issue 26 item 3) runs two or
// three global routers, each behind its own ext_proc server, on the same
// local routers, and checks the burst spreads as with one and that every
// in-flight count is exact, also when one router is killed mid-burst.
//
// Files: probe.go (the probe benchmark), floor.go (its gRPC floor),
// decision.go (the decision benchmark's configuration, figures and kvgate
// side), decision_run.go (its phases: warm-up, sequential, floor, paced;
// DecisionModes, several commit modes and pools in one report),
// decision_parts.go (the parts of a decision: the timed tokenizer, the
// round trips counted on the wire, the floor beside the routers, the
// probe configuration file), activeactive.go (ActiveActiveConfig,
// ActiveActiveResult, the exchange), activeactive_side.go (a global
// router under test, in this process or a child, and how it is killed),
// activeactive_run.go (one burst and its checks), soak.go (SoakConfig, SoakResult,
// Soak), soak_load.go (the soak's requests: warm-up, held streams, the
// steady load), soak_measure.go (heap and goroutine measures, the
// decision-time histogram, profiles), fdlimit.go, fdlimit_unix.go and
// fdlimit_other.go (the file descriptors a soak needs, RLIMIT_NOFILE),
// idle.go (the idle-streams benchmark: silent ext_proc streams against
// the server's stream bounds, heap and goroutines before, held, after).
package loadbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/kvgate/kvgate/internal/benchfig"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter/client"
	"github.com/kvgate/kvgate/localrouter/server"
)

// ProbeConfig shapes the probe benchmark.
type ProbeConfig struct {
	// Rate is the probes per second offered (open loop).
	Rate int
	// N is the probes per mode.
	N int
	// Rounds alternates the modes this many times (each round N/Rounds
	// probes of each), so both see the same machine noise.
	Rounds int
	// Callers are the goroutines offering the probes (default 64: enough
	// that a slow answer does not hold the offered rate back).
	Callers int
	// PackedHashes sends the channel's hashes as packed bytes instead of
	// the repeated field.
	PackedHashes bool
	// Only runs one mode ("channel", "unary", "harness" or "grpc-floor";
	// "": all), for profiles.
	Only string
	// ServerProcess serves the router from a child process (this
	// binary re-executed; its main must call ServeChild first), so
	// the client's CPU and the server's are measured apart and the
	// client's garbage does not bring the index's heap to its next GC.
	ServerProcess bool
	// Profile, if set, receives a CPU profile of the paced windows only
	// (from the first window's start to the last one's end: use it with
	// Only), without the index build and the warm-up.
	Profile io.Writer
	// ServerProfile, with ServerProcess, is a file the server process
	// writes its CPU profile of the same windows to.
	ServerProfile string
}

// ProbeFigures are one mode's figures.
type ProbeFigures struct {
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	CPUusPerProbe float64 `json:"cpu_us_per_probe"`
	// With ServerProcess, CPUusPerProbe is their sum.
	ClientCPUusPerProbe float64 `json:"client_cpu_us_per_probe,omitempty"`
	ServerCPUusPerProbe float64 `json:"server_cpu_us_per_probe,omitempty"`
	Probes              int     `json:"probes"`
	Errors              int     `json:"errors"`
	// Rate is the probes per second achieved.
	Rate float64 `json:"rate"`
}

// ProbeResult is the side-by-side run.
type ProbeResult struct {
	Channel ProbeFigures `json:"channel"`
	Unary   ProbeFigures `json:"unary"`
	// Harness is the pacing alone (the same callers, sleeps and
	// per-probe contexts, a probe that does nothing): the part of each
	// mode's CPU per probe that is the benchmark's own, not the
	// transport's. It is not subtracted from the modes' figures.
	Harness ProbeFigures `json:"harness"`
	// GRPCFloor is a request the size of a probe's hashes and an empty
	// answer on a bare gRPC stream to the same server, no router work
	// (floor.go): the transport's own latency and CPU.
	GRPCFloor ProbeFigures `json:"grpc_floor"`
}

// CPUTime is the process's user+system CPU time (getrusage).
func CPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Probe serves the benchfig world (64 workers, ≈1M index entries, 200
// requests in flight) over loopback gRPC with the production server
// options, and offers cfg.Rate state-free probes of 512-block prompts per
// second, alternately through a Channel and through unary BestWorker; and
// the same pacing with a probe that does nothing (ProbeResult.Harness) and
// a bare gRPC round trip of a probe's size (ProbeResult.GRPCFloor).
func Probe(ctx context.Context, cfg ProbeConfig) (ProbeResult, error) {
	if cfg.Rate <= 0 || cfg.N < 100 {
		return ProbeResult{}, fmt.Errorf("probe bench: need a positive rate and at least 100 probes (got rate %d, n %d)", cfg.Rate, cfg.N)
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 4
	}
	if cfg.Callers <= 0 {
		cfg.Callers = 64
	}
	var (
		addr    string
		prompts []benchfig.Prompt
		// serverCPU is the server process's CPU time so far, when it is
		// not this one.
		serverCPU func() (time.Duration, error)
	)
	if cfg.ServerProcess {
		child, err := startProbeServer(ctx, cfg.ServerProfile)
		if err != nil {
			return ProbeResult{}, err
		}
		defer child.stop()
		addr, serverCPU = child.addr, child.cpu
		prompts = benchfig.MakePrompts(benchfig.Prompts, worldSeed)
	} else {
		a, world, stop, err := serveProbe(ctx)
		if err != nil {
			return ProbeResult{}, err
		}
		defer stop()
		addr, prompts = a, world
	}
	c, err := client.Dial(addr, nil)
	if err != nil {
		return ProbeResult{}, err
	}
	defer c.Close()
	ch := c.Channel(client.ChannelOptions{PackedHashes: cfg.PackedHashes})
	defer ch.Close()
	floorConn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return ProbeResult{}, err
	}
	defer floorConn.Close()
	floor, err := newFloorClient(ctx, floorConn, 8*benchfig.Blocks)
	if err != nil {
		return ProbeResult{}, err
	}
	defer floor.close()

	hashed := make([]client.Prompt, len(prompts))
	for i, p := range prompts {
		hashed[i] = client.HashPrompt(p.Local, benchfig.BlockSize)
	}
	modes := []struct {
		name  string
		probe func(context.Context, client.Prompt) error
		acc   *acc
	}{
		{"unary", func(ctx context.Context, p client.Prompt) error {
			_, err := c.BestWorker(ctx, p, client.BestWorkerOptions{})
			return err
		}, &acc{}},
		{"channel", func(ctx context.Context, p client.Prompt) error {
			_, err := ch.BestWorker(ctx, p, client.BestWorkerOptions{})
			return err
		}, &acc{}},
		{"harness", func(context.Context, client.Prompt) error { return nil }, &acc{}},
		{"grpc-floor", func(ctx context.Context, _ client.Prompt) error { return floor.roundTrip(ctx) }, &acc{}},
	}
	// Warm them (connections, the streams, caches).
	for _, md := range modes {
		for i := range 200 {
			if err := md.probe(ctx, hashed[i%len(hashed)]); err != nil {
				return ProbeResult{}, fmt.Errorf("probe bench: %s warm-up: %w", md.name, err)
			}
		}
	}
	per := max(cfg.N/cfg.Rounds, 1)
	if cfg.Profile != nil {
		if err := pprof.StartCPUProfile(cfg.Profile); err != nil {
			return ProbeResult{}, fmt.Errorf("probe bench: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	for r := range cfg.Rounds {
		for _, md := range modes {
			if err := ctx.Err(); err != nil {
				return ProbeResult{}, err
			}
			if cfg.Only != "" && cfg.Only != md.name {
				continue
			}
			if err := paced(ctx, cfg.Rate, per, cfg.Callers, r*per, hashed, md.probe, serverCPU, md.acc); err != nil {
				return ProbeResult{}, err
			}
		}
	}
	return ProbeResult{Unary: modes[0].acc.figures(), Channel: modes[1].acc.figures(), Harness: modes[2].acc.figures(), GRPCFloor: modes[3].acc.figures()}, nil
}

// worldSeed is benchfig.BuildWorld's prompts' seed: a client of a server
// process makes the same prompts.
const worldSeed = 7

// serveProbe serves the benchfig world over loopback gRPC with the
// production server options; it returns the address, the world's prompts
// and how to stop.
func serveProbe(ctx context.Context) (string, []benchfig.Prompt, func(), error) {
	w, err := benchfig.BuildWorld()
	if err != nil {
		return "", nil, nil, err
	}
	if err := w.AddActive(ctx); err != nil {
		w.Router.Close()
		return "", nil, nil, err
	}
	srv, err := server.New(server.Options{Router: w.Router, Pool: "bench", RouterID: "bench"})
	if err != nil {
		w.Router.Close()
		return "", nil, nil, err
	}
	m, err := server.NewMetrics(prometheus.NewRegistry(), srv, nil)
	if err != nil {
		w.Router.Close()
		return "", nil, nil, err
	}
	g := grpc.NewServer(server.GRPCServerOptions(m)...)
	srv.Register(g)
	testgrpc.RegisterBenchmarkServiceServer(g, floorService{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.Router.Close()
		return "", nil, nil, err
	}
	go func() { _ = g.Serve(lis) }()
	return lis.Addr().String(), w.Prompts, func() { g.Stop(); w.Router.Close() }, nil
}

// probeServerEnv marks the process Probe starts with ServerProcess;
// probeServerProfileEnv names its profile's file.
const (
	probeServerEnv        = config.EnvProbeServer
	probeServerProfileEnv = config.EnvProbeServerProfile
)

// ServeChild, called first in main (or TestMain), makes this binary a
// benchmark's server process when the benchmark started it so
// (ProbeConfig.ServerProcess, DecisionConfig.ServerProcess): it serves
// until its standard input closes, then returns true, and the caller
// exits. Otherwise it returns false at once.
//
// The probe server's protocol on its standard streams: it writes
// "addr HOST:PORT" once serving the benchfig world; to each line read it
// answers "cpu NANOSECONDS", its CPU time so far. It profiles its CPU from
// the first such line to the end when Probe asked
// (ProbeConfig.ServerProfile). The decision server's: serveDecisionServer;
// an active-active global router's: serveAARouter.
func ServeChild() bool {
	var err error
	switch {
	case os.Getenv(probeServerEnv) == "1":
		err = serveProbeServer(os.Stdin, os.Stdout, os.Getenv(probeServerProfileEnv))
	case os.Getenv(decisionServerEnv) == "1":
		err = serveDecisionServer(os.Stdin, os.Stdout, os.Getenv(decisionServerProfileEnv))
	case os.Getenv(aaServerEnv) == "1":
		err = serveAARouter(os.Stdin, os.Stdout)
	default:
		return false
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmark server process:", err)
		os.Exit(1)
	}
	return true
}

func serveProbeServer(in io.Reader, out io.Writer, profile string) error {
	addr, _, stop, err := serveProbe(context.Background())
	if err != nil {
		return err
	}
	defer stop()
	if _, err := fmt.Fprintf(out, "addr %s\n", addr); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	stopProfile := func() {}
	defer func() { stopProfile() }()
	for lines.Scan() {
		if profile != "" {
			if stopProfile, err = startCPUProfile(profile); err != nil {
				return err
			}
			profile = ""
		}
		if _, err := fmt.Fprintf(out, "cpu %d\n", CPUTime().Nanoseconds()); err != nil {
			return err
		}
	}
	return lines.Err()
}

// startCPUProfile profiles this process's CPU to the file path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// probeServer is a running server process.
type probeServer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	// out reads its lines, of any length: the decision server's snapshot
	// of a 12,000-request paced window is a line of 163 KB (a
	// bufio.Scanner stops at 64 KiB).
	out  *bufio.Reader
	addr string
}

// startProbeServer re-executes this binary as the probe server process
// and waits until it serves.
func startProbeServer(ctx context.Context, profile string) (*probeServer, error) {
	return startChild(ctx, "probe bench", probeServerEnv+"=1", probeServerProfileEnv+"="+profile)
}

// startChild re-executes this binary with env added (what names the
// server to be) and waits for its first line, "addr ..."; addr is the rest.
func startChild(ctx context.Context, what string, env ...string) (*probeServer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%s: server process: %w", what, err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: server process: %w", what, err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: server process: %w", what, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: server process: %w", what, err)
	}
	ps := &probeServer{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := ps.line()
	if a, ok := strings.CutPrefix(line, "addr "); err == nil && ok {
		ps.addr = a
		return ps, nil
	}
	ps.stop()
	return nil, fmt.Errorf("%s: the server process did not start (does %s call loadbench.ServeChild first?): got %q, %v", what, exe, line, err)
}

// line reads the server process's next line (without its newline); a
// line cut short by the process's end is io.ErrUnexpectedEOF.
func (ps *probeServer) line() (string, error) {
	line, err := ps.out.ReadString('\n')
	if errors.Is(err, io.EOF) {
		return "", io.ErrUnexpectedEOF
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// cpu is the server process's CPU time so far.
func (ps *probeServer) cpu() (time.Duration, error) {
	if _, err := io.WriteString(ps.in, "cpu\n"); err != nil {
		return 0, fmt.Errorf("probe bench: server process: %w", err)
	}
	line, err := ps.line()
	if err != nil {
		return 0, fmt.Errorf("probe bench: server process: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimPrefix(line, "cpu "), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("probe bench: server process: %q: %w", line, err)
	}
	return time.Duration(ns), nil
}

// stop closes the server process's input, which ends it, and waits. It
// reads what the process still writes meanwhile: a process blocked
// writing an answer nobody reads (its caller gave up on it) would never
// see its input close, and Wait would wait forever (a 12,000-request
// decision benchmark hung so).
func (ps *probeServer) stop() {
	_ = ps.in.Close()
	_, _ = io.Copy(io.Discard, ps.out) // until the process ends and its output closes
	_ = ps.cmd.Wait()
}

// acc accumulates one mode's rounds.
type acc struct {
	durs      []time.Duration
	cpu       time.Duration // this process's
	serverCPU time.Duration // the server process's, if apart
	elapsed   time.Duration
	errors    int
}

func (a *acc) figures() ProbeFigures {
	n := len(a.durs)
	lat := benchfig.Percentiles(a.durs)
	f := ProbeFigures{
		P50us: float64(lat.P50.Nanoseconds()) / 1e3, P99us: float64(lat.P99.Nanoseconds()) / 1e3,
		Probes: n, Errors: a.errors,
	}
	if n > 0 {
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n+a.errors) }
		f.CPUusPerProbe = per(a.cpu + a.serverCPU)
		if a.serverCPU > 0 {
			f.ClientCPUusPerProbe, f.ServerCPUusPerProbe = per(a.cpu), per(a.serverCPU)
		}
		f.Rate = float64(n+a.errors) / a.elapsed.Seconds()
	}
	return f
}

// paced offers n probes at rate per second from callers goroutines (probe
// i at start + i/rate; a late caller does not skip), timing each from its
// send. serverCPU (nil: the server is this process) is the server
// process's CPU time.
func paced(ctx context.Context, rate, n, callers, offset int, prompts []client.Prompt, probe func(context.Context, client.Prompt) error, serverCPU func() (time.Duration, error), a *acc) error {
	interval := time.Second / time.Duration(rate)
	durs := make([]time.Duration, n)
	ok := make([]bool, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var server0 time.Duration
	if serverCPU != nil {
		var err error
		if server0, err = serverCPU(); err != nil {
			return err
		}
	}
	cpu0 := CPUTime()
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d) // pacing
				}
				p := prompts[((offset+i)*31)%len(prompts)]
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				t0 := time.Now()
				err := probe(pctx, p)
				durs[i] = time.Since(t0)
				cancel()
				ok[i] = err == nil
			}
		}()
	}
	wg.Wait()
	a.elapsed += time.Since(start)
	a.cpu += CPUTime() - cpu0
	if serverCPU != nil {
		server1, err := serverCPU()
		if err != nil {
			return err
		}
		a.serverCPU += server1 - server0
	}
	for i, d := range durs {
		if ok[i] {
			a.durs = append(a.durs, d)
		} else {
			a.errors++
		}
	}
	return nil
}
