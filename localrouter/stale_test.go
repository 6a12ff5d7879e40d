package localrouter

import (
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
)

// TestStaleWorkerIsNoCandidate (issue 13 item 5): a worker marked stale
// (it cannot publish its KV events) is not chosen, even when it caches the
// whole prompt, while a fresh worker is left; when every worker is stale
// routing goes on; a pin still reaches it; unmarking or removal clears it.
func TestStaleWorkerIsNoCandidate(t *testing.T) {
	ctx := testenv.Context(t)
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r := newRouter(t, cfg, "a", "b")
	prompt := toks(64, 0)
	storeTokens(t, r, "b", prompt)
	best := func(opts BestWorkerOptions) string {
		t.Helper()
		sel, err := r.BestWorker(ctx, Request{Tokens: prompt}, opts)
		if err != nil {
			t.Fatal(err)
		}
		return sel.WorkerID
	}
	if got := best(BestWorkerOptions{}); got != "b" {
		t.Fatalf("before: BestWorker = %s, want b (it caches the prompt)", got)
	}
	r.SetWorkerStale("b", true)
	if !r.WorkerStale("b") {
		t.Error("WorkerStale(b) = false after marking it")
	}
	for range 20 {
		if got := best(BestWorkerOptions{}); got != "a" {
			t.Fatalf("b stale: BestWorker = %s, want a", got)
		}
	}
	if got := best(BestWorkerOptions{Worker: &WorkerKey{ID: "b"}}); got != "b" {
		t.Errorf("pinned to stale b: BestWorker = %s, want b", got)
	}
	r.SetWorkerStale("a", true)
	if got := best(BestWorkerOptions{}); got != "b" {
		t.Errorf("every worker stale: BestWorker = %s, want b (routing goes on)", got)
	}
	r.SetWorkerStale("a", false)
	r.SetWorkerStale("b", false)
	if got := best(BestWorkerOptions{}); got != "b" {
		t.Errorf("b fresh again: BestWorker = %s, want b", got)
	}
	r.SetWorkerStale("b", true)
	r.RemoveWorker("b")
	if r.WorkerStale("b") {
		t.Error("WorkerStale(b) after RemoveWorker, want cleared")
	}
}
