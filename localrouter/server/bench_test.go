package server

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/internal/benchfig"
	"github.com/kvgate/kvgate/localrouter/client"
)

// benchService serves the benchmark workload's router (benchfig: 64
// workers, ≈1M index entries, 200 requests in flight) over loopback gRPC
// with the production interceptors, and returns a client of it.
func benchService(b *testing.B) (*client.Client, []benchfig.Prompt) {
	b.Helper()
	w, err := benchfig.BuildWorld()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Router.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.AddActive(ctx); err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{Router: w.Router, Pool: "bench", RouterID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry(), srv, nil)
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(GRPCServerOptions(m)...)
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go g.Serve(lis)
	b.Cleanup(g.Stop)
	c, err := client.Dial(lis.Addr().String(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c, w.Prompts
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportLatency(b *testing.B, durs []time.Duration, cpu time.Duration) {
	lat := benchfig.Percentiles(durs)
	b.ReportMetric(float64(lat.P50.Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat.P99.Nanoseconds())/1e3, "p99-µs")
	// Client and server share the process: this counts both sides.
	b.ReportMetric(float64(len(durs))/cpu.Seconds(), "calls/cpu-s")
}

// BenchmarkBestWorkerGRPC: the state-free probe of a 512-block request,
// hashes on the wire, one call at a time.
func BenchmarkBestWorkerGRPC(b *testing.B) {
	c, prompts := benchService(b)
	ctx := context.Background()
	durs := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		p := prompts[i%len(prompts)]
		t0 := time.Now()
		if _, err := c.BestWorker(ctx, client.HashPrompt(p.Local, benchfig.BlockSize), client.BestWorkerOptions{}); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(t0))
	}
	cpu := cpuTime() - cpu0
	b.StopTimer()
	reportLatency(b, durs, cpu)
}

// BenchmarkBestWorkerGRPCAt5k: the same probe offered at 5,000 calls/s
// (open loop, 16 callers), the target rate.
func BenchmarkBestWorkerGRPCAt5k(b *testing.B) {
	c, prompts := benchService(b)
	ctx := context.Background()
	const rate = 5000
	interval := time.Second / rate
	durs := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					return
				}
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d) // pacing, not waiting for a condition
				}
				p := prompts[i%len(prompts)]
				t0 := time.Now()
				if _, err := c.BestWorker(ctx, client.HashPrompt(p.Local, benchfig.BlockSize), client.BestWorkerOptions{}); err != nil {
					b.Error(err)
					return
				}
				durs[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	reportLatency(b, durs, cpu)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
}
