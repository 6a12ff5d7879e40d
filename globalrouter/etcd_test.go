package globalrouter_test

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// TestEtcdDiscoveredPool: a pool whose local router registered in etcd
// serves from the first request, and across a reload (New and Reload wait
// for discovery's first listing).
func TestEtcdDiscoveredPool(t *testing.T) {
	ctx := testenv.Context(t)
	_, cli := testenv.StartEtcd(t)
	srv := pooltest.Start(t, "pool-e", 16, pooltest.Workers("e", 2)...)
	info := fmt.Sprintf(`{"id":"r1","grpc_address":%q,"pool":"pool-e","block_size":16}`, srv.Addr)
	if _, err := cli.Put(ctx, membership.RouterKey("pool-e", "r1"), info); err != nil {
		t.Fatal(err)
	}
	pc := pool.NewConfig("pool-e", 16, []string{model})
	pc.Routers = pool.Routers{Etcd: true}
	cfg := globalrouter.DefaultConfig(pc)
	cfg.Probe.Timeout = 10e9
	r, _ := newRouter(t, cfg, globalrouter.WithEtcd(cli))
	for i := range 2 {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hello"})
		if err != nil {
			t.Fatalf("Decide %d: %v", i, err)
		}
		if d.Primary.Pool != "pool-e" {
			t.Errorf("primary %+v, want pool-e", d.Primary)
		}
		free(t, d)
		if err := r.Reload(cfg); err != nil {
			t.Fatalf("Reload: %v", err)
		}
	}
}
