package globalrouter_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// TestProbeDeadline: a pool whose router accepts the connection and never
// answers costs a decision its probe deadline, not the decision: the live
// pool serves it, the explanation shows the deadline, and the hung
// router's circuit opens on its second timeout in a row. The timeouts are
// counted as the router counts them (kvgate_globalrouter_probe_duration_seconds
// outcome "timeout"): a deadline that fired late because this process was
// starved of CPU ("starved") counts against no circuit, so on a loaded
// machine the test decides again until two timeouts have counted, and
// checks the circuit after each decision: closed below two, open at two.
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
	// A clock that stands still: the open circuit does not turn half-open
	// (its backoff elapsed) before Health reads it, whatever the
	// machine's speed. The probe deadlines run on the real clock.
	now := time.Unix(1000, 0)
	r, reg := newRouter(t, cfg, globalrouter.WithClock(func() time.Time { return now }))
	for i := 0; ; i++ {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(30), Explain: true})
		if err != nil {
			t.Fatalf("Decide %d with a hung pool: %v", i, err)
		}
		free(t, d)
		if d.Primary.Pool != "pool-b" || len(otherPools(d)) != 0 {
			t.Errorf("Decide %d: primary %s, fallbacks %+v; want pool-b alone", i, d.Primary.Pool, d.Fallbacks)
		}
		// The circuit was closed before this decision: pool-a was probed.
		if !strings.Contains(d.Explanation, "DeadlineExceeded") {
			t.Errorf("Decide %d: explanation does not show pool-a's probe deadline:\n%s", i, d.Explanation)
		}
		timeouts := probeCount(t, reg, "pool-a", "timeout")
		state := r.Health()[0].Routers[0].State
		switch {
		case timeouts < 2 && state != pool.CircuitClosed:
			t.Fatalf("after decision %d, %d counted timeouts: pool-a circuit = %v, want closed", i, timeouts, state)
		case timeouts < 2:
			continue
		case state != pool.CircuitOpen:
			t.Errorf("after %d counted timeouts: pool-a circuit = %v, want %v", timeouts, state, pool.CircuitOpen)
		}
		t.Logf("pool-a's circuit opened on its second counted timeout, after %d decisions (%d deadlines fired late on a starved process, not counted)",
			i+1, probeCount(t, reg, "pool-a", "starved"))
		return
	}
}

// probeCount is how many probes of poolName ended with outcome
// (kvgate_globalrouter_probe_duration_seconds' count).
func probeCount(t *testing.T, reg *prometheus.Registry, poolName, outcome string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_globalrouter_probe_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pool"] == poolName && labels["outcome"] == outcome {
				return int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
