package globalrouter_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// TestQueuedDecisionCountedOnce: a request that waits in the flow-control
// queue, tried again and again while the pool stays saturated, is one
// decision in kvgate_globalrouter_decisions_total (its outcome when it
// leaves the queue); its tries are kvgate_flowcontrol_tries_total's.
func TestQueuedDecisionCountedOnce(t *testing.T) {
	ctx := testenv.Context(t)
	lr := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 1)...)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, lr.Addr))
	cfg.Probe.Timeout, cfg.Probe.MinTimeout = 10*time.Second, 10*time.Second
	cfg.FlowControl = flowcontrol.Config{Enabled: true, Deadline: time.Minute, Reprobe: 10 * time.Millisecond,
		Saturation: flowcontrol.Saturation{MaxPrefillTokens: 100}}
	r, reg := newRouter(t, cfg)
	prompt := func(base int) *globalrouter.Request {
		toks := make([]uint32, 200)
		for i := range toks {
			toks[i] = uint32(base + i)
		}
		return &globalrouter.Request{Model: model, PromptTokens: toks}
	}

	a, err := r.Decide(ctx, prompt(0)) // idle pool: goes at once, and saturates it
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		d   *globalrouter.Decision
		err error
	}
	bDone := make(chan result, 1)
	go func() {
		d, err := r.Decide(ctx, prompt(5000))
		bDone <- result{d, err}
	}()
	// The waiting request is tried again (every reprobe) while a holds
	// the pool.
	testenv.Eventually(t, 20*time.Second, func() (string, bool) {
		n := countByLabel(t, reg, "kvgate_flowcontrol_tries_total", "outcome", "saturated")
		return fmt.Sprintf("saturated tries of the waiting request: %v, want 3 or more", n), n >= 3
	})
	free(t, a)
	b := <-bDone
	if b.err != nil {
		t.Fatalf("b: %v", b.err)
	}
	free(t, b.d)

	if got := countByLabel(t, reg, "kvgate_globalrouter_decisions_total", "outcome", "ok"); got != 2 {
		t.Errorf("decisions ok: got %v, want 2 (a, and b once)", got)
	}
	if got := countByLabel(t, reg, "kvgate_globalrouter_decisions_total", "outcome", "saturated"); got != 0 {
		t.Errorf("decisions saturated: got %v, want 0 (b's tries are not decisions)", got)
	}
	if got := countByLabel(t, reg, "kvgate_flowcontrol_tries_total", "outcome", "dispatched"); got != 1 {
		t.Errorf("tries dispatched: got %v, want 1", got)
	}
}
