package client_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

// TestNoHerding fires a burst of 64 identical long prompts at a pool of 4
// idle workers, all at once, and checks that they spread over the 4 workers
// by capacity instead of landing on one. Each placement records the
// request's blocks as predicted on its worker (KV events on) and charges it
// their prefill, and placing decisions are serialised, so the next decision
// sees that worker loaded. Under the default chain (saturation, ttft) and
// under Dynamo's cost chain, the latter with credit 1, scale 1 and with
// the replay's kvgate row (credit 8, scale 8), under which predicted blocks
// weighed like cached ones would draw the burst onto the first worker
// (credit and scale are read by the cost scorer only: under the default
// chain they are no axis).
//
// Three paths. Decide-and-commit — a BestWorker with a request id, or a
// commit without a worker on the Track stream — must spread exactly by
// capacity. A state-free probe, then the commit of the probed worker
// pipelined on a Track stream (the global router's pipelined path) lets
// probes race ahead of commits, so it runs in waves of one probe per worker
// (the next wave probing once the last one's commits are answered) and is
// only checked not to herd onto one worker (docs/localrouter.md, predicted
// entries, says by how much it skews).
func TestNoHerding(t *testing.T) {
	for _, tc := range []struct {
		name          string
		chain         []localrouter.ScorerSpec
		credit, scale float64
	}{
		{"default-chain", nil, 1, 1},
		{"cost/credit=1,scale=1", localrouter.CostWorkerChain(), 1, 1},
		{"cost/credit=8,scale=8", localrouter.CostWorkerChain(), 8, 8},
	} {
		for _, path := range []string{pathBestWorker, pathTrackCommit, pathProbeThenCommit} {
			t.Run(tc.name+"/"+path, func(t *testing.T) {
				cfg := localrouter.DefaultConfig()
				cfg.WorkerChain = tc.chain
				cfg.OverlapScoreCredit, cfg.PrefillLoadScale = tc.credit, tc.scale
				if u := cfg.Unread(false); len(u) > 0 {
					t.Fatalf("a setting of the case is not read: %q", u)
				}
				testNoHerding(t, cfg, path)
			})
		}
	}
}

// The placement paths of TestNoHerding.
const (
	pathBestWorker      = "best-worker-with-id"
	pathTrackCommit     = "track-commit-without-worker"
	pathProbeThenCommit = "probe-then-commit"
)

func testNoHerding(t *testing.T, cfg localrouter.Config, path string) {
	decideAndCommit := path != pathProbeThenCommit
	const (
		burst   = 64
		workers = 4
	)
	ids := []string{"w1", "w2", "w3", "w4"}
	p, c, ctx := setupWith(t, cfg, ids...)
	hashes, err := kvevents.LocalHashes(prompt(0, 8192), 16, "")
	if err != nil {
		t.Fatal(err)
	}
	pr := client.HashPrompt(hashes, 16)
	// The probe-then-commit burst goes in waves of one probe per worker,
	// each wave's commits answered before the next wave probes: probes of
	// one wave may race ahead of its commits (state-free, they may all pick
	// one worker), but the next wave must see them. All 64 at once would
	// leave it to the scheduler whether any commit lands before the last
	// probe (under -race on a busy machine, sometimes none does: then all
	// pick one worker, rightly, and the check would fail by chance).
	wave := burst
	if path == pathProbeThenCommit {
		wave = workers
	}
	starts := make([]chan struct{}, burst/wave)
	waves := make([]sync.WaitGroup, len(starts))
	for i := range starts {
		starts[i] = make(chan struct{})
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		placed  = map[string]int{}
		errs    []error
		tracker []*client.AsyncTracker
		direct  []string
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var answered sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		w := &waves[i/wave]
		w.Add(1)
		go func() {
			defer wg.Done()
			defer w.Done() // after its commit's answer, below
			<-starts[i/wave]
			if path == pathBestWorker {
				sel, err := c.BestWorker(ctx, pr, client.BestWorkerOptions{RequestID: fmt.Sprint("r", i)})
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				placed[sel.WorkerID]++
				direct = append(direct, fmt.Sprint("r", i))
				mu.Unlock()
				return
			}
			var worker localrouter.WorkerKey // none: the router chooses
			if path == pathProbeThenCommit {
				sel, err := c.BestWorker(ctx, pr, client.BestWorkerOptions{})
				if err != nil {
					fail(err)
					return
				}
				worker = localrouter.Selected(sel)
			}
			answered.Add(1)
			done := make(chan struct{})
			tr, err := c.CommitAsync(ctx, fmt.Sprint("r", i), worker, pr, func(got routing.Selection, err error) {
				defer answered.Done()
				defer close(done)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				placed[got.WorkerID]++
				mu.Unlock()
			})
			if err != nil {
				answered.Done()
				fail(err)
				return
			}
			mu.Lock()
			tracker = append(tracker, tr)
			mu.Unlock()
			<-done
		}()
	}
	for i := range starts {
		close(starts[i])
		waves[i].Wait()
	}
	wg.Wait()
	answered.Wait()
	for _, tr := range tracker {
		if err := tr.Free(ctx); err != nil {
			t.Error(err)
		}
	}
	for _, id := range direct {
		if err := c.Free(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if len(errs) > 0 {
		t.Fatalf("%d requests failed, the first: %v", len(errs), errs[0])
	}
	t.Logf("placed: %v", placed)
	fair := burst / workers
	for _, id := range ids {
		n := placed[id]
		switch {
		case decideAndCommit && (n < fair-1 || n > fair+1):
			t.Errorf("worker %s got %d of %d requests, want %d±1 (all: %v)", id, n, burst, fair, placed)
		case !decideAndCommit && n >= burst-workers:
			t.Errorf("worker %s got %d of %d requests: the burst herded onto it (all: %v)", id, n, burst, placed)
		}
	}
	if !decideAndCommit && len(placed) < 2 {
		t.Errorf("the burst landed on %d worker(s): %v", len(placed), placed)
	}
	p.waitIdle(t)
}
