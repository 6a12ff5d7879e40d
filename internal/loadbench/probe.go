// Package loadbench is `kvgate bench`'s load figures (BENCHMARKS.md,
// "Performance"): the side-by-side probe benchmark (the local-router
// Channel against today's unary BestWorker, on the same ≈1M-entry index in
// one run) and the soak (thousands of concurrent streaming requests through
// the ext_proc server and the Envoy-faithful client to mock workers, then
// every router's in-flight count back to 0). Both ends run in this process,
// so CPU figures (getrusage) count client and server together.
package loadbench

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/internal/benchfig"
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
	// Only runs one mode ("channel" or "unary"; "": both), for profiles.
	Only string
	// Profile, if set, receives a CPU profile of the paced windows only
	// (from the first window's start to the last one's end: use it with
	// Only), without the index build and the warm-up.
	Profile io.Writer
}

// ProbeFigures are one mode's figures.
type ProbeFigures struct {
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	CPUusPerProbe float64 `json:"cpu_us_per_probe"`
	Probes        int     `json:"probes"`
	Errors        int     `json:"errors"`
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
// second, alternately through a Channel and through unary BestWorker.
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
	w, err := benchfig.BuildWorld()
	if err != nil {
		return ProbeResult{}, err
	}
	defer w.Router.Close()
	if err := w.AddActive(ctx); err != nil {
		return ProbeResult{}, err
	}
	srv, err := server.New(server.Options{Router: w.Router, Pool: "bench", RouterID: "bench"})
	if err != nil {
		return ProbeResult{}, err
	}
	m, err := server.NewMetrics(prometheus.NewRegistry(), srv, nil)
	if err != nil {
		return ProbeResult{}, err
	}
	g := grpc.NewServer(server.GRPCServerOptions(m)...)
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return ProbeResult{}, err
	}
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	c, err := client.Dial(lis.Addr().String(), nil)
	if err != nil {
		return ProbeResult{}, err
	}
	defer c.Close()
	ch := c.Channel(client.ChannelOptions{PackedHashes: cfg.PackedHashes})
	defer ch.Close()

	prompts := make([]client.Prompt, len(w.Prompts))
	for i, p := range w.Prompts {
		prompts[i] = client.HashPrompt(p.Local, benchfig.BlockSize)
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
	}
	// Warm both (connections, the channel's stream, caches).
	for _, md := range modes[:2] {
		for i := range 200 {
			if err := md.probe(ctx, prompts[i%len(prompts)]); err != nil {
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
			paced(ctx, cfg.Rate, per, cfg.Callers, r*per, prompts, md.probe, md.acc)
		}
	}
	return ProbeResult{Unary: modes[0].acc.figures(), Channel: modes[1].acc.figures(), Harness: modes[2].acc.figures()}, nil
}

// acc accumulates one mode's rounds.
type acc struct {
	durs    []time.Duration
	cpu     time.Duration
	elapsed time.Duration
	errors  int
}

func (a *acc) figures() ProbeFigures {
	n := len(a.durs)
	lat := benchfig.Percentiles(a.durs)
	f := ProbeFigures{
		P50us: float64(lat.P50.Nanoseconds()) / 1e3, P99us: float64(lat.P99.Nanoseconds()) / 1e3,
		Probes: n, Errors: a.errors,
	}
	if n > 0 {
		f.CPUusPerProbe = float64(a.cpu.Nanoseconds()) / 1e3 / float64(n+a.errors)
		f.Rate = float64(n+a.errors) / a.elapsed.Seconds()
	}
	return f
}

// paced offers n probes at rate per second from callers goroutines (probe
// i at start + i/rate; a late caller does not skip), timing each from its
// send.
func paced(ctx context.Context, rate, n, callers, offset int, prompts []client.Prompt, probe func(context.Context, client.Prompt) error, a *acc) {
	interval := time.Second / time.Duration(rate)
	durs := make([]time.Duration, n)
	ok := make([]bool, n)
	var next atomic.Int64
	var wg sync.WaitGroup
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
	for i, d := range durs {
		if ok[i] {
			a.durs = append(a.durs, d)
		} else {
			a.errors++
		}
	}
}
