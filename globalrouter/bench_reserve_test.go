package globalrouter_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// BenchmarkDecideModes is the sequential decision in each commit mode
// (decide, reserve, pipelined), over one pool and over two pools of 8
// workers behind real local routers on loopback gRPC (the default channel
// dialer), with the two floors measured in the same sub-benchmark, right
// after its decisions: tokenizing the same kind of prompt alone, and the
// gRPC floor — a bare request/response pair of a probe's size (the
// prompt's block hashes, 8 bytes each) on a long-lived bidirectional
// stream over loopback, grpc-go's own benchmark service (as
// internal/loadbench's floor). Reported: the decision's p50 and p99, the
// floors' p50s, round-trips = (decision p50 − tokenize p50) / floor p50
// (the target: ≤ 1.3), and the process's CPU per decision (user +
// system, every goroutine: the global router and the local routers it
// talks to, which run in this process). Each decision is freed before the
// next; the frees are outside the latency, inside the CPU.
func BenchmarkDecideModes(b *testing.B) {
	ctx := testenv.Context(b)
	prefix := chatTokens(b, chat8K(0))
	floor := startFloor(b, len(prefix)/16*8)
	for _, pools := range []int{1, 2} {
		var cfgs []pool.Config
		for i := range pools {
			name := fmt.Sprint("pool-", i)
			srv := pooltest.Start(b, name, 16, pooltest.Workers(fmt.Sprint("w", i), 8)...)
			if i == 0 {
				srv.Store(b, "w0-3", prefix[:len(prefix)-32])
			}
			cfgs = append(cfgs, pool.NewConfig(name, 16, []string{model}, srv.Addr))
		}
		for _, mode := range []globalrouter.CommitMode{globalrouter.CommitDecide, globalrouter.CommitReserve, globalrouter.CommitPipelined} {
			b.Run(fmt.Sprintf("pools=%d/%s", pools, mode), func(b *testing.B) {
				cfg := globalrouter.DefaultConfig(cfgs...)
				cfg.Probe.Timeout = time.Second // not under test: a busy machine must not open circuits
				cfg.Probe.Commit = mode
				r, _ := newRouter(b, cfg)
				var lat []time.Duration
				cpu0 := cpuTime()
				i := 0
				b.ReportAllocs()
				for b.Loop() {
					i++
					req := &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat8K(i)...)}
					t0 := time.Now()
					d, err := r.Decide(ctx, req)
					lat = append(lat, time.Since(t0))
					if err != nil {
						b.Fatal(err)
					}
					if err := d.Lease.Free(ctx); err != nil {
						b.Fatal(err)
					}
				}
				cpu := cpuTime() - cpu0
				n := len(lat)
				tok := tokenizeP50(b, n)
				fl := floor.p50(b, n)
				p50 := pct(lat, 50)
				b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
				b.ReportMetric(float64(pct(lat, 99).Microseconds()), "p99-µs")
				b.ReportMetric(float64(tok.Microseconds()), "tokenize-p50-µs")
				b.ReportMetric(float64(fl.Microseconds()), "floor-p50-µs")
				b.ReportMetric(float64(p50-tok)/float64(fl), "round-trips")
				b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/decision")
			})
		}
	}
}

// pct is the p-th percentile of d (sorted in place).
func pct(d []time.Duration, p int) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*p/100)]
}

// tokenizeP50 is tokenizing n prompts of the benchmark's kind alone (the
// same tokenizer, a new last turn each time): the floor of a decision.
func tokenizeP50(b *testing.B, n int) time.Duration {
	tok := sharedTokenizer(b)
	tl := make([]time.Duration, 0, n)
	for i := range n {
		t0 := time.Now()
		if _, err := tok.EncodeChat(tokenizer.NewChat(chat8K(1_000_000 + i)...)); err != nil {
			b.Fatal(err)
		}
		tl = append(tl, time.Since(t0))
	}
	return pct(tl, 50)
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// floorEcho answers each request of a StreamingCall with an empty
// response, in order (grpc-go's benchmark service, doing nothing).
type floorEcho struct {
	testgrpc.UnimplementedBenchmarkServiceServer
}

func (floorEcho) StreamingCall(s testgrpc.BenchmarkService_StreamingCallServer) error {
	in, out := new(testgrpc.SimpleRequest), new(testgrpc.SimpleResponse)
	for {
		if err := s.RecvMsg(in); err != nil {
			return nil
		}
		if err := s.Send(out); err != nil {
			return err
		}
	}
}

// grpcFloor is a client of a floorEcho stream with a payload of a probe's
// size.
type grpcFloor struct {
	stream  testgrpc.BenchmarkService_StreamingCallClient
	payload *testgrpc.SimpleRequest
}

func startFloor(b *testing.B, payloadBytes int) *grpcFloor {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	testgrpc.RegisterBenchmarkServiceServer(srv, floorEcho{})
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	st, err := testgrpc.NewBenchmarkServiceClient(conn).StreamingCall(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return &grpcFloor{stream: st, payload: &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, payloadBytes)}}}
}

// p50 is the median of n sequential round trips.
func (f *grpcFloor) p50(b *testing.B, n int) time.Duration {
	out := new(testgrpc.SimpleResponse)
	d := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := f.stream.Send(f.payload); err != nil {
			b.Fatal(err)
		}
		if err := f.stream.RecvMsg(out); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	return pct(d, 50)
}
