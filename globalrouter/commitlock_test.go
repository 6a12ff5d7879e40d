package globalrouter_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// hold holds back the answer to the decide-and-commit of one request: its
// commit reaches the local router, but the global router does not hear
// back until release is closed.
type hold struct {
	request string
	sent    chan struct{} // closed once the held commit is sent
	release chan struct{}
	once    sync.Once
}

// heldClient is a local-router client whose commits of hold.request are
// held back.
type heldClient struct {
	pool.Client
	h *hold
}

func (c heldClient) CommitAsync(ctx context.Context, cm pool.Commit, committed func(routing.Selection, error)) (pool.Tracker, error) {
	if cm.RequestID != c.h.request {
		return c.Client.CommitAsync(ctx, cm, committed)
	}
	tr, err := c.Client.CommitAsync(ctx, cm, func(sel routing.Selection, err error) {
		go func() {
			<-c.h.release
			committed(sel, err)
		}()
	})
	c.h.once.Do(func() { close(c.h.sent) })
	return tr, err
}

// heldDialer is the channel dialer whose clients hold back h's commits.
func heldDialer(h *hold) pool.Dialer {
	base := pool.ChannelDialer()
	return func(addr string) (pool.Client, error) {
		c, err := base(addr)
		if err != nil {
			return nil, err
		}
		return heldClient{Client: c, h: h}, nil
	}
}

// TestUncontendedCommitsDoNotWait: a decision whose decide-and-commit is
// still waiting for its local router's answer does not hold up other
// decisions' commits. Before, every multi-pool commit held one router-wide
// lock across its round trip, so the Decides here would wait for the
// first's answer (and the test would hang until its deadline). Only a
// contended commit (an answer costlier than its probe) serialises.
func TestUncontendedCommitsDoNotWait(t *testing.T) {
	ctx := testenv.Context(t)
	a := pooltest.Start(t, "pool-0", 16, pooltest.Workers("a", 4)...)
	b := pooltest.Start(t, "pool-1", 16, pooltest.Workers("b", 4)...)
	h := &hold{request: "slow", sent: make(chan struct{}), release: make(chan struct{})}
	dial := heldDialer(h)
	r, _ := newRouter(t, herdConfig(a, b), globalrouter.WithDialer(dial))
	slow := make(chan error, 1)
	go func() {
		d, err := r.Decide(ctx, &globalrouter.Request{ID: "slow", Model: model, PromptTokens: herdTokens(512)})
		if err == nil {
			err = d.Lease.Free(ctx)
		}
		slow <- err
	}()
	select {
	case <-h.sent:
	case <-ctx.Done():
		t.Fatal("the held commit was never sent")
	}
	for i := range 4 {
		tokens := herdTokens(512)
		for k := range tokens {
			tokens[k] += uint32(10000 * (i + 1)) // another prompt: no shared prefix
		}
		d, err := r.Decide(ctx, &globalrouter.Request{ID: fmt.Sprint("fast-", i), Model: model, PromptTokens: tokens})
		if err != nil {
			t.Fatalf("Decide fast-%d while slow's commit is unanswered: %v", i, err)
		}
		free(t, d)
	}
	close(h.release)
	if err := <-slow; err != nil {
		t.Errorf("the held decision: %v", err)
	}
}

// TestTimedOutDecideStaysAccounted: a decide-and-commit whose answer does
// not come within its deadline falls back to the pipelined commit of the
// probed worker, and the request is then held on the local router once,
// as a decided request would be, until its lease is freed.
func TestTimedOutDecideStaysAccounted(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "pool-0", 16, pooltest.Workers("a", 2)...)
	h := &hold{request: "late", sent: make(chan struct{}), release: make(chan struct{})}
	dial := heldDialer(h)
	cfg := herdConfig(srv)
	cfg.Probe.Timeout, cfg.Probe.MinTimeout = 300*time.Millisecond, 300*time.Millisecond
	r, _ := newRouter(t, cfg, globalrouter.WithDialer(dial))
	d, err := r.Decide(ctx, &globalrouter.Request{ID: "late", Model: model, PromptTokens: herdTokens(256), Explain: true})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if !strings.Contains(d.Explanation, "fell back") {
		t.Fatalf("the decide-and-commit did not fall back: %q", d.Explanation)
	}
	if err := srv.WaitActive(ctx, 1); err != nil {
		t.Fatalf("after a decide-and-commit fell back: %v", err)
	}
	close(h.release)
	free(t, d)
	if err := srv.WaitIdle(ctx); err != nil {
		t.Fatalf("after the lease was freed: %v", err)
	}
}

// Release forwards to the wrapped client's (a pool.Releaser), so that
// reserve-mode decisions through a heldClient release their losers.
func (c heldClient) Release(ctx context.Context, id string) error {
	if r, ok := c.Client.(pool.Releaser); ok {
		return r.Release(ctx, id)
	}
	return nil
}

// TestReserveWaitsForNoCommit: with probe.commit: reserve a decision does
// not wait for its commit's answer at all — here the answer is held back
// and the decision returns anyway, on the probed worker — while the
// commit confirms the reservation on the router (the request is held
// there once, the losing pool's reservation released), and other
// decisions go on meanwhile. Nothing here takes Router.recheckMu.
func TestReserveWaitsForNoCommit(t *testing.T) {
	ctx := testenv.Context(t)
	a := pooltest.Start(t, "pool-0", 16, pooltest.Workers("a", 2)...)
	b := pooltest.Start(t, "pool-1", 16, pooltest.Workers("b", 2)...)
	h := &hold{request: "held", sent: make(chan struct{}), release: make(chan struct{})}
	cfg := herdConfig(a, b)
	cfg.Probe.Commit = globalrouter.CommitReserve
	r, reg := newRouter(t, cfg, globalrouter.WithDialer(heldDialer(h)))
	d, err := r.Decide(ctx, &globalrouter.Request{ID: "held", Model: model, PromptTokens: herdTokens(512)})
	if err != nil {
		t.Fatalf("Decide with its commit's answer held back: %v", err)
	}
	held := map[string]*pooltest.Server{"pool-0": a, "pool-1": b}[d.Primary.Pool]
	other := map[string]*pooltest.Server{"pool-0": b, "pool-1": a}[d.Primary.Pool]
	if err := held.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := other.WaitIdle(ctx); err != nil {
		t.Fatalf("the losing pool's reservation: %v", err)
	}
	for i := range 4 {
		tokens := herdTokens(512)
		for k := range tokens {
			tokens[k] += uint32(10000 * (i + 1))
		}
		f, err := r.Decide(ctx, &globalrouter.Request{ID: fmt.Sprint("fast-", i), Model: model, PromptTokens: tokens})
		if err != nil {
			t.Fatalf("Decide fast-%d: %v", i, err)
		}
		free(t, f)
	}
	close(h.release)
	free(t, d)
	for _, s := range []*pooltest.Server{a, b} {
		if err := s.WaitIdle(ctx); err != nil {
			t.Error(err)
		}
		if rs := s.Router.ReservationStats(); rs.Held != 0 || rs.Expired != 0 || rs.Missed != 0 {
			t.Errorf("%s reservations %+v: none should be held, expired or missed", s.Addr, rs)
		}
	}
	if n := countByLabel(t, reg, "kvgate_globalrouter_contended_commits_total", "pool", "pool-0") +
		countByLabel(t, reg, "kvgate_globalrouter_contended_commits_total", "pool", "pool-1"); n != 0 {
		t.Errorf("%v contended commits, want 0", n)
	}
}
