package globalrouter_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
)

// A request served by a fallback in the primary's own pool (one pool, the
// default layout) moves to it and stays counted: the fallback's local
// router is the primary's, which still holds the request's id until the
// primary is freed, so the moved commit must not reuse it (it was refused
// as already active and the request was then counted nowhere).
func TestMoveWithinThePrimarysPool(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, c.a.Addr))
	cfg.Probe.Timeout = c.cfg.Probe.Timeout
	r, _ := newRouter(t, cfg)
	var d *globalrouter.Decision
	testenv.Eventually(t, 20*time.Second, func() (string, bool) {
		var err error
		if d, err = r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(20)}); err != nil {
			t.Fatal(err)
		}
		if len(d.Fallbacks) > 0 && d.Fallbacks[0].Pool == "pool-a" {
			return "", true
		}
		free(t, d)
		return "no same-pool fallback yet", false
	})
	if err := c.a.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := d.Lease.(globalrouter.Mover).Move(ctx, d.Fallbacks[0]); err != nil {
		t.Fatalf("Move: %v", err)
	}
	// The move is pipelined: poll until the primary is freed and the
	// fallback holds the request, and make sure it stays so.
	testenv.Eventually(t, 20*time.Second, func() (string, bool) {
		if n := c.a.ActiveRequests(); n != 1 {
			return fmt.Sprintf("%d requests active on pool-a after a same-pool move, want 1", n), false
		}
		return "", true
	})
	if err := d.Lease.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete after the move: %v", err)
	}
	if n := c.a.ActiveRequests(); n != 1 {
		t.Errorf("%d requests active on pool-a after the moved request's prefill, want 1", n)
	}
	free(t, d)
	if err := c.a.WaitActive(ctx, 0); err != nil {
		t.Fatal(err)
	}
}
