package globalrouter_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// hungRouter is a fake local router (the one seam it replaces: a router
// that accepts the connection and never answers a probe).
type hungRouter struct {
	localrouterv1.UnimplementedLocalRouterServer
}

func (hungRouter) BestWorker(ctx context.Context, _ *localrouterv1.BestWorkerRequest) (*localrouterv1.BestWorkerResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestProbeDeadline(t *testing.T) {
	ctx := testenv.Context(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	localrouterv1.RegisterLocalRouterServer(g, hungRouter{})
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(lis) }()
	defer func() { g.Stop(); <-served }()

	live := pooltest.Start(t, "pool-b", 16, pooltest.Workers("b", 2)...)
	cfg := globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{model}, lis.Addr().String()),
		pool.NewConfig("pool-b", 16, []string{model}, live.Addr),
	)
	// The hung router never answers, so any deadline expires; one long
	// enough for the live router on a busy machine.
	cfg.Probe.Timeout, cfg.Probe.MinTimeout = 1e9, 1e9
	// One slow probe is no evidence of failure: the circuit opens on the
	// second timeout in a row here (10 by default).
	cfg.Probe.OpenAfterTimeouts = 2
	r, _ := newRouter(t, cfg)
	for i, want := range []pool.CircuitState{pool.CircuitClosed, pool.CircuitOpen} {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(30), Explain: true})
		if err != nil {
			t.Fatalf("Decide %d with a hung pool: %v", i, err)
		}
		free(t, d)
		if d.Primary.Pool != "pool-b" || len(otherPools(d)) != 0 {
			t.Errorf("Decide %d: primary %s, fallbacks %+v; want pool-b alone", i, d.Primary.Pool, d.Fallbacks)
		}
		if !strings.Contains(d.Explanation, "DeadlineExceeded") {
			t.Errorf("Decide %d: explanation does not show pool-a's probe deadline:\n%s", i, d.Explanation)
		}
		if h := r.Health(); h[0].Routers[0].State != want {
			t.Errorf("after %d timeouts: pool-a circuit = %v, want %v", i+1, h[0].Routers[0].State, want)
		}
	}
}
