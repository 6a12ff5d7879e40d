package pool_test

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// BenchmarkProbe is one state-free probe of a local router of 8 workers
// over loopback gRPC, for a 2,048-token prompt.
func BenchmarkProbe(b *testing.B) {
	ctx := testenv.Context(b)
	srv := pooltest.Start(b, "p", 16, pooltest.Workers("w", 8)...)
	conns := pool.NewConns(pool.GRPCDialer(), pool.CircuitOptions{}, nil)
	defer conns.Close()
	p := openB(b, conns, srv.Addr)
	pr := promptB(b, tokens(2048, 1))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Probe(ctx, pr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTrack is one commit on a Track stream and its Free.
func BenchmarkTrack(b *testing.B) {
	ctx := testenv.Context(b)
	srv := pooltest.Start(b, "p", 16, pooltest.Workers("w", 8)...)
	conns := pool.NewConns(pool.GRPCDialer(), pool.CircuitOptions{}, nil)
	defer conns.Close()
	p := openB(b, conns, srv.Addr)
	pr := promptB(b, tokens(2048, 1))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		tr, _, err := p.Commit(ctx, "", pool.Commit{RequestID: fmt.Sprint(i), WorkerID: "w-1", Prompt: pr})
		if err != nil {
			b.Fatal(err)
		}
		if err := tr.Free(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
