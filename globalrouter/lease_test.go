package globalrouter_test

import (
	"sync"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
)

func TestLeaseConcurrentAndIdempotent(t *testing.T) {
	ctx := testCtx(t)
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
	ctx := testCtx(t)
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
