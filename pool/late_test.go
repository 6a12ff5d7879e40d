package pool_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// outcomes records late commits' outcomes by request id.
type outcomes struct {
	mu  sync.Mutex
	got map[string]pool.LateOutcome
	ch  chan struct{}
}

func newOutcomes() *outcomes {
	return &outcomes{got: map[string]pool.LateOutcome{}, ch: make(chan struct{}, 64)}
}

func (o *outcomes) of(id string) func(pool.LateOutcome) {
	return func(out pool.LateOutcome) {
		o.mu.Lock()
		o.got[id] = out
		o.mu.Unlock()
		o.ch <- struct{}{}
	}
}

// wait waits for id's outcome.
func (o *outcomes) wait(ctx context.Context, t *testing.T, id string) pool.LateOutcome {
	t.Helper()
	for {
		o.mu.Lock()
		out, ok := o.got[id]
		o.mu.Unlock()
		if ok {
			return out
		}
		select {
		case <-o.ch:
		case <-ctx.Done():
			t.Fatalf("no outcome for %s: %v", id, ctx.Err())
		}
	}
}

// TestCommitLate (issue 27 item 4): a commit made while the pool's only
// router is down reaches the router once it is back, with its request's
// prefill-complete after it; a request that ended while the router was
// down is never committed (no load left behind).
func TestCommitLate(t *testing.T) {
	ctx := testenv.Context(t)
	workers := pooltest.Workers("w", 2)
	srv := pooltest.Start(t, "p", 16, workers...)
	addr := srv.Addr
	p := open(t, newConns(t, nil), "p", addr)
	pr := prompt(t, tokens(64, 1), 16)
	if _, err := p.Probe(ctx, pr); err != nil {
		t.Fatalf("Probe of a live router: %v", err)
	}
	srv.Stop()
	if _, err := p.Probe(ctx, pr); err == nil {
		t.Fatal("Probe of a stopped router succeeded")
	}

	o := newOutcomes()
	kept := p.CommitLate(pool.Commit{RequestID: "kept", WorkerID: "w-1", Prompt: pr}, o.of("kept"))
	ended := p.CommitLate(pool.Commit{RequestID: "ended", WorkerID: "w-0", Prompt: pr}, o.of("ended"))
	if err := kept.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete before the commit was sent: %v", err)
	}
	if err := ended.Free(ctx); err != nil {
		t.Errorf("Free before the commit was sent: %v", err)
	}
	if got := o.wait(ctx, t, "ended"); got != pool.LateEnded {
		t.Errorf("a request that ended while no router answered: outcome %q, want %q", got, pool.LateEnded)
	}

	back := pooltest.StartOn(t, addr, "p", 16, workers...)
	if got := o.wait(ctx, t, "kept"); got != pool.LateCommitted {
		t.Fatalf("the queued commit: outcome %q, want %q", got, pool.LateCommitted)
	}
	if n := back.ActiveRequests(); n != 1 {
		t.Errorf("the router back holds %d requests, want the one queued", n)
	}
	if n := p.Late(); n != 0 {
		t.Errorf("%d late commits still queued, want 0", n)
	}
	if err := kept.Free(ctx); err != nil {
		t.Errorf("Free after the late commit: %v", err)
	}
	if err := back.WaitIdle(ctx); err != nil {
		t.Errorf("after Free: %v", err)
	}
}

// TestCommitLateBounded: a pool whose routers stay down holds at most
// Options.LateCommits late commits; past it the oldest is dropped, and
// Close drops the rest.
func TestCommitLateBounded(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 1)...)
	srv.Stop()
	p, err := pool.Open(pool.NewConfig("p", 16, []string{"m"}, srv.Addr), pool.Options{Conns: newConns(t, nil), ProbeTimeout: time.Second, LateCommits: 2})
	if err != nil {
		t.Fatal(err)
	}
	pr := prompt(t, tokens(64, 1), 16)
	o := newOutcomes()
	for _, id := range []string{"a", "b", "c"} {
		p.CommitLate(pool.Commit{RequestID: id, WorkerID: "w-0", Prompt: pr}, o.of(id))
	}
	if got := o.wait(ctx, t, "a"); got != pool.LateDropped {
		t.Errorf("the oldest of 3 late commits on a queue of 2: outcome %q, want %q", got, pool.LateDropped)
	}
	if n := p.Late(); n > 2 {
		t.Errorf("%d late commits queued, want at most 2", n)
	}
	p.Close()
	for _, id := range []string{"b", "c"} {
		if got := o.wait(ctx, t, id); got != pool.LateDropped {
			t.Errorf("%s at Close: outcome %q, want %q", id, got, pool.LateDropped)
		}
	}
}

// TestKnownBeforeFirstProbe: a pool learns its workers from its routers
// as soon as it has them, so a best-effort decision has a target before
// any probe succeeded.
func TestKnownBeforeFirstProbe(t *testing.T) {
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 2)...)
	p := open(t, newConns(t, nil), "p", srv.Addr)
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		if sel, ok := p.LastKnown(nil); !ok || sel.Address == "" {
			return "the pool knows no worker yet", false
		}
		return "", true
	})
}
