package globalrouter_test

import (
	"errors"
	"net"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// The endpoint-picker protocol's subset clause: with a subset, the
// primary and every fallback are in it, the local routers pick the best
// allowed worker, and an empty subset or one naming no worker is
// ErrNoEndpointInSubset.
func TestSubsetBoundsEveryEndpoint(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	a, b := pooltest.Workers("a", 3), pooltest.Workers("b", 2)
	prompt := longText(60)
	// Without a subset the primary is pool-a's cached worker a-0.
	c.a.Store(t, "a-0", chatTokens(t, chat(prompt)))
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(prompt)...)})
	if err != nil {
		t.Fatal(err)
	}
	if d.Primary.WorkerID != "a-0" {
		t.Fatalf("primary %s without a subset, want the cached a-0", d.Primary.WorkerID)
	}
	free(t, d)

	for _, tc := range []struct {
		name    string
		subset  []string
		allowed map[string]bool // addresses a decision may name; nil: ErrNoEndpointInSubset
		primary string
	}{
		{"the cached worker excluded: the best allowed", []string{a[2].Address, b[1].Address}, map[string]bool{a[2].Address: true, b[1].Address: true}, "a-2"},
		{"only pool-b", []string{b[0].Address}, map[string]bool{b[0].Address: true}, "b-0"},
		{"a host without a port", []string{hostOf(t, a[1].Address)}, map[string]bool{a[1].Address: true}, "a-1"},
		{"empty", []string{}, nil, ""},
		{"no worker listed", []string{"192.0.2.1:8000"}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(prompt)...), Subset: &globalrouter.Subset{Addresses: tc.subset}})
			if tc.allowed == nil {
				if !errors.Is(err, globalrouter.ErrNoEndpointInSubset) {
					t.Fatalf("got %v, want ErrNoEndpointInSubset", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer free(t, d)
			if d.Primary.WorkerID != tc.primary {
				t.Errorf("primary %s, want %s", d.Primary.WorkerID, tc.primary)
			}
			for _, e := range append([]globalrouter.Endpoint{d.Primary}, d.Fallbacks...) {
				if !tc.allowed[e.Address] {
					t.Errorf("endpoint %s/%s at %s is outside the subset %v", e.Pool, e.WorkerID, e.Address, tc.subset)
				}
			}
		})
	}
	if err := c.a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
	if err := c.b.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}

// A pinned worker outside the subset is refused as no endpoint in it.
func TestSubsetRefusesPinnedWorkerOutside(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	b := pooltest.Workers("b", 2)
	_, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(20),
		Headers: map[string]string{globalrouter.HeaderWorkerID: "a-1"}, Subset: &globalrouter.Subset{Addresses: []string{b[0].Address}}})
	if !errors.Is(err, globalrouter.ErrNoEndpointInSubset) {
		t.Fatalf("got %v, want ErrNoEndpointInSubset", err)
	}
	if err := c.a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}

// The served clause: when the data plane served the request from a
// fallback, Move commits it on the fallback's local router and frees it on
// the primary's; the lifecycle then follows the fallback.
func TestMoveToServedFallback(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	prompt := longText(60)
	c.a.Store(t, "a-0", chatTokens(t, chat(prompt)))
	d, err := r.Decide(ctx, &globalrouter.Request{ID: "req-move", Model: model, Chat: tokenizer.NewChat(chat(prompt)...)})
	if err != nil {
		t.Fatal(err)
	}
	if d.Primary.Pool != "pool-a" || len(d.Fallbacks) == 0 || d.Fallbacks[0].Pool != "pool-b" {
		t.Fatalf("decision %s then %v, want pool-a then a pool-b fallback", d.Primary.Pool, d.Fallbacks)
	}
	if err := c.a.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := d.Lease.PrefillComplete(ctx); err != nil {
		t.Fatal(err)
	}
	m, ok := d.Lease.(globalrouter.Mover)
	if !ok {
		t.Fatal("the lease is not a Mover")
	}
	if err := m.Move(ctx, d.Fallbacks[0]); err != nil {
		t.Fatalf("Move: %v", err)
	}
	if err := c.a.WaitIdle(ctx); err != nil {
		t.Errorf("primary's router after the move: %v", err)
	}
	if err := c.b.WaitActive(ctx, 1); err != nil {
		t.Errorf("served fallback's router after the move: %v", err)
	}
	if err := d.Lease.Free(ctx); err != nil {
		t.Errorf("Free: %v", err)
	}
	if err := c.b.WaitIdle(ctx); err != nil {
		t.Errorf("served fallback's router after Free: %v", err)
	}
	// After Free a move does nothing lasting.
	_ = m.Move(ctx, d.Fallbacks[0])
	if err := c.b.WaitIdle(ctx); err != nil {
		t.Errorf("a move after Free left a request: %v", err)
	}
}

// A decision without fallbacks has nowhere to move.
func TestMoveWithoutFallbacks(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, c.a.Addr))
	cfg.Probe.Timeout = c.cfg.Probe.Timeout
	r, _ := newRouter(t, cfg)
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(20)})
	if err != nil {
		t.Fatal(err)
	}
	defer free(t, d)
	if err := d.Lease.(globalrouter.Mover).Move(ctx, globalrouter.Endpoint{Pool: "pool-b"}); err == nil {
		t.Error("Move without fallbacks: no error")
	}
}

// Ready: loaded and a pool reachable.
func TestReady(t *testing.T) {
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	if !r.Ready() {
		t.Error("Ready false with both pools up")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r.Ready() {
		t.Error("Ready true after Close")
	}
}

func hostOf(t *testing.T, addr string) string {
	t.Helper()
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
