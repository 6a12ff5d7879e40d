package globalrouter_test

import (
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// BenchmarkDecideOnePool decides in-process against one pool of 8 workers
// behind a real local router over loopback gRPC: with one eligible pool
// the decision is one decide-and-commit call (a commit without a worker on
// the Track stream, waited for) instead of a probe plus a pipelined commit.
func BenchmarkDecideOnePool(b *testing.B) {
	ctx := testenv.Context(b)
	pa := pooltest.Start(b, "pool-a", 16, pooltest.Workers("a", 8)...)
	prefix := chatTokens(b, chat8K(0))
	pa.Store(b, "a-3", prefix[:len(prefix)-32])
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, pa.Addr))
	cfg.Probe.Timeout = time.Second
	r, _ := newRouter(b, cfg)
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat8K(i + 1)...)}
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
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
