package globalrouter_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
)

func TestLeaseConcurrentAndIdempotent(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	for range 5 {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(40)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Explanation != "" {
			t.Errorf("explanation without Explain: %q", d.Explanation)
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { _ = d.Lease.PrefillComplete(ctx) })
			wg.Go(func() {
				if err := d.Lease.Free(ctx); err != nil {
					t.Errorf("Free: %v", err)
				}
			})
		}
		wg.Wait()
	}
	if a, b := c.a.ActiveRequests(), c.b.ActiveRequests(); a+b != 0 {
		t.Errorf("after Free: %d + %d active requests, want 0", a, b)
	}
}

func TestCloseFreesOpenLeases(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(40)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The broken Track stream frees the request on its local router.
	if err := c.a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
	if err := c.b.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
	_ = d.Lease.Free(ctx) // after Close: still safe
	if _, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "x"}); err == nil {
		t.Error("Decide after Close: no error")
	}
}

// TestRefusedCommitSurfacesOnLease: with probe.commit: pipelined a commit
// the local router refuses after the decision (here a duplicate request
// id) does not undo the decision; it is counted, and the lease reports it.
// (decide-and-commit moves on instead: herding_test.go.)
func TestRefusedCommitSurfacesOnLease(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, c.a.Addr))
	cfg.Probe.Timeout = c.cfg.Probe.Timeout
	cfg.Probe.Commit = globalrouter.CommitPipelined
	r, reg := newRouter(t, cfg)
	req := &globalrouter.Request{ID: "dup", Model: model, Prompt: longText(40)}
	first, err := r.Decide(ctx, req)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if err := c.a.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	second, err := r.Decide(ctx, req) // the same id: pool-a's router refuses it
	if err != nil {
		t.Fatalf("Decide with a refused pipelined commit: got %v, want the probed worker", err)
	}
	if second.Primary.Pool != "pool-a" || second.Primary.Address == "" {
		t.Errorf("primary = %+v, want pool-a's probed worker", second.Primary)
	}
	if err := second.Lease.PrefillComplete(ctx); !errors.Is(err, globalrouter.ErrCommitRefused) {
		t.Errorf("PrefillComplete of the refused commit: got %v, want ErrCommitRefused", err)
	}
	if err := second.Lease.Free(ctx); err != nil {
		t.Errorf("Free of the refused commit: got %v, want nil (nothing to free)", err)
	}
	if got := testutil.ToFloat64(mustCounter(t, reg, "kvgate_globalrouter_refused_commits_total", "pool-a")); got != 1 {
		t.Errorf("refused commits = %v, want 1", got)
	}
	// The refusal left the first request alone.
	if n := c.a.ActiveRequests(); n != 1 {
		t.Errorf("after the refusal: %d active, want 1 (the first request)", n)
	}
	free(t, first)
	if err := c.a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}
