package subtree_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
)

// TestAnonymousCommitExpiry (issue 27 item 4): with ExpireAnonymous on, a
// request an unauthenticated caller committed by a unary Commit is freed
// below after the bound; one freed before is not freed twice; one on a
// Track stream stays until its stream frees it.
func TestAnonymousCommitExpiry(t *testing.T) {
	ctx := testenv.Context(t)
	tok := loadTokenizer(t)
	rg := newRegion(t, tok)
	var expired atomic.Int64
	rg.srv.ExpireAnonymous(100*time.Millisecond, func() { expired.Add(1) })
	c := dial(t, rg.addr)
	_, p := hashes(t, tok, long(100))

	tr, err := c.CommitAsync(ctx, "tracked", localrouter.WorkerKey{ID: "pool-a/a-0"}, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, "freed", localrouter.WorkerKey{ID: "pool-b/b-0"}, p); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(ctx, "freed"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, "phantom", localrouter.WorkerKey{ID: "pool-b/b-1"}, p); err != nil {
		t.Fatal(err)
	}
	if err := rg.b.WaitIdle(ctx); err != nil {
		t.Fatalf("the anonymous unary commit below: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		return "the expiry is not counted yet", expired.Load() == 1
	})
	if err := c.Free(ctx, "phantom"); !errors.Is(err, localrouter.ErrUnknownRequest) {
		t.Errorf("Free of the expired request: %v, want unknown request", err)
	}
	if n := rg.a.ActiveRequests(); n != 1 {
		t.Errorf("the request on a Track stream: pool-a holds %d, want 1", n)
	}
	if err := tr.Free(ctx); err != nil {
		t.Fatal(err)
	}
	rg.waitIdle(t, ctx)
	if n := expired.Load(); n != 1 {
		t.Errorf("%d requests expired, want 1 (the freed one is not freed again)", n)
	}
}
