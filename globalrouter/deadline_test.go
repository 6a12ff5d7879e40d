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
	cfg.Probe.Timeout = 1e9
	r, _ := newRouter(t, cfg)
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(30), Explain: true})
	if err != nil {
		t.Fatalf("Decide with a hung pool: %v", err)
	}
	defer free(t, d)
	if d.Primary.Pool != "pool-b" || len(d.Fallbacks) != 0 {
		t.Errorf("primary %s, %d fallbacks; want pool-b alone", d.Primary.Pool, len(d.Fallbacks))
	}
	if !strings.Contains(d.Explanation, "DeadlineExceeded") {
		t.Errorf("explanation does not show pool-a's probe deadline:\n%s", d.Explanation)
	}
	if h := r.Health(); h[0].Routers[0].State != pool.CircuitOpen {
		t.Errorf("pool-a circuit = %v, want open", h[0].Routers[0].State)
	}
}
