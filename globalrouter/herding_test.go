package globalrouter_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// TestDecideBurstSpreads fires 64 identical long prompts at once through
// the global router at one pool of 4 idle workers behind a real local
// router: with one eligible pool the decision and the commit are one call,
// so each decision sees the ones before it and the burst spreads by
// capacity, 16 each, instead of herding onto the worker every probe would
// have found cheapest.
func TestDecideBurstSpreads(t *testing.T) {
	const burst, workers = 64, 4
	ctx := testenv.Context(t)
	a := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", workers)...)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, a.Addr))
	cfg.Probe.Timeout = 10 * time.Second // behaviour on a shared machine, not speed
	r, _ := newRouter(t, cfg)
	prompt := longText(4000)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		placed    = map[string]int{}
		decisions []*globalrouter.Decision
		errs      []error
	)
	start := make(chan struct{})
	for i := range burst {
		wg.Go(func() {
			<-start
			d, err := r.Decide(ctx, &globalrouter.Request{ID: fmt.Sprint("burst-", i), Model: model, Prompt: prompt})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			placed[d.Primary.WorkerID]++
			decisions = append(decisions, d)
		})
	}
	close(start)
	wg.Wait()
	for _, d := range decisions {
		free(t, d)
	}
	if len(errs) > 0 {
		t.Fatalf("%d decisions failed, the first: %v", len(errs), errs[0])
	}
	t.Logf("placed: %v", placed)
	if len(placed) != workers {
		t.Errorf("the burst used %d of %d workers: %v", len(placed), workers, placed)
	}
	for w, n := range placed {
		if n < burst/workers-1 || n > burst/workers+1 {
			t.Errorf("worker %s got %d of %d, want %d±1 (all: %v)", w, n, burst, burst/workers, placed)
		}
	}
	if err := a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}
