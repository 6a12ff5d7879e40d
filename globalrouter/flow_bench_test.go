package globalrouter_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// BenchmarkFlowControl measures what flow control costs a request, as
// ratios to the decision it guards, all in one run: Decide against two
// pools of 8 workers behind real local routers (loopback gRPC), as
// BenchmarkDecide, without flow control and with it on but the pools not
// saturated (the queue's lookup and the saturation rule on every
// decision); and the queue's own work for a request that waits (Enqueue,
// Peek, Dispatch in a queue holding 64 requests of 8 tenants in two
// bands: the per-request cost in the core, the live wrapper's lock
// around it aside).
func BenchmarkFlowControl(b *testing.B) {
	ctx := testenv.Context(b)
	pa := pooltest.Start(b, "pool-a", 16, pooltest.Workers("a", 8)...)
	pb := pooltest.Start(b, "pool-b", 16, pooltest.Workers("b", 8)...)
	cfg := globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{model}, pa.Addr),
		pool.NewConfig("pool-b", 16, []string{model}, pb.Addr),
	)
	cfg.Probe.Timeout = time.Second
	off, _ := newRouter(b, cfg)
	cfg.FlowControl = flowcontrol.Config{Enabled: true, Saturation: flowcontrol.Saturation{MaxPrefillTokens: 1 << 30}}
	on, _ := newRouter(b, cfg)

	p50 := func(r *globalrouter.Router, base int) time.Duration {
		lat := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N; i++ {
			req := &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat8K(base + i)...)}
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
		slices.Sort(lat)
		return lat[len(lat)/2]
	}
	b.ReportAllocs()
	b.ResetTimer()
	// Interleaved halves, so that a load change on the machine touches
	// both alike.
	offA, onA := p50(off, 1), p50(on, b.N+1)
	offB, onB := p50(off, 2*b.N+1), p50(on, 3*b.N+1)
	b.StopTimer()
	decideOff, decideOn := (offA+offB)/2, (onA+onB)/2

	q, err := flowcontrol.New(flowcontrol.Config{Enabled: true, Capacity: flowcontrol.Capacity{Requests: 1 << 20, Bytes: 1 << 40}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(0, 0)
	flows := make([]string, 8)
	for i := range flows {
		flows[i] = "tenant-" + strconv.Itoa(i)
	}
	for i := range 64 {
		if _, err := q.Enqueue(now, flowcontrol.Request{Priority: i % 2, Flow: flows[i%8], Bytes: 8 << 10}); err != nil {
			b.Fatal(err)
		}
	}
	n := max(b.N, 10000)
	t0 := time.Now()
	for range n {
		t := q.Peek() // steady state: replaced by one of its band and tenant
		q.Dispatch(t)
		now = now.Add(time.Microsecond)
		if _, err := q.Enqueue(now, flowcontrol.Request{Priority: t.Priority, Flow: t.Flow, Bytes: 8 << 10}); err != nil {
			b.Fatal(err)
		}
	}
	perQueued := time.Since(t0) / time.Duration(n)

	b.ReportMetric(float64(decideOff.Microseconds()), "decide-p50-µs")
	b.ReportMetric(float64(decideOn.Nanoseconds())/float64(decideOff.Nanoseconds()), "decide-flow-on/off-p50")
	b.ReportMetric(float64(perQueued.Nanoseconds()), "queue-ns/request")
	b.ReportMetric(float64(perQueued.Nanoseconds())/float64(decideOff.Nanoseconds()), "queue/decide")
}
