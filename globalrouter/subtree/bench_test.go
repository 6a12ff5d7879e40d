package subtree_test

import (
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// The extra hop of a tree (BENCHMARKS.md, "Hierarchy"): a parent's probe
// of one pool's local router directly, against the same pool through one
// subtree router, both over loopback gRPC with the parent's default
// client (pool.ChannelDialer). The subtree router's own probe of the pool
// carries a hop count, so it goes unary (pool/channel.go).
//
//	go test -run '^$' -bench Probe -benchtime 3s ./globalrouter/subtree/
func BenchmarkProbe(b *testing.B) {
	tok := loadTokenizer(b)
	lr := pooltest.Start(b, "pool-a", 16, pooltest.Workers("a", 4)...)
	toks, _ := hashes(b, tok, long(400)) // ~800 tokens, 50 blocks
	lr.Store(b, "a-1", toks[:len(toks)/2])
	r := newRouter(b, globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, lr.Addr)), tok)
	lis := listen(b)
	serve(b, r, lis)
	_, cp := hashes(b, tok, long(400))
	p := pool.Prompt{Hashes: cp.BlockHashes, BlockSize: 16, ISL: len(toks)}

	for _, tt := range []struct {
		name, addr, want string
		dial             pool.Dialer
	}{
		{"direct", lr.Addr, "a-1", pool.ChannelDialer()},
		// The unary client, for comparison: what the subtree router's own
		// probe of the pool costs.
		{"direct-unary", lr.Addr, "a-1", pool.GRPCDialer()},
		{"subtree", lis.Addr().String(), "pool-a/a-1", pool.ChannelDialer()},
	} {
		b.Run(tt.name, func(b *testing.B) {
			c, err := tt.dial(tt.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := b.Context()
			if sel, err := c.Probe(ctx, p); err != nil || sel.WorkerID != tt.want {
				b.Fatalf("probe = %+v, %v; want %s", sel, err, tt.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Probe(ctx, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
