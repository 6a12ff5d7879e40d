package globalrouter_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

func TestDecideFollowsTheCache(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	msgs := chat(longText(200))
	toks := chatTokens(t, msgs)
	// b-1 holds the whole conversation's prefix.
	c.b.Store(t, "b-1", toks)

	d, err := r.Decide(ctx, &globalrouter.Request{ID: "r1", Path: "/v1/chat/completions", Model: model, Chat: tokenizer.NewChat(msgs...), Explain: true})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	defer free(t, d)
	if d.Primary.Pool != "pool-b" || d.Primary.WorkerID != "b-1" {
		t.Fatalf("primary = %+v, want pool-b/b-1 (it caches the prompt)\n%s", d.Primary, d.Explanation)
	}
	if want := len(toks) / 16; d.Primary.OverlapBlocks != want || d.RequestBlocks != want || d.ISL != len(toks) {
		t.Errorf("primary overlap %d, request blocks %d, ISL %d; want %d, %d, %d", d.Primary.OverlapBlocks, d.RequestBlocks, d.ISL, want, want, len(toks))
	}
	if d.Primary.Address == "" {
		t.Error("primary has no address")
	}
	if o := otherPools(d); len(o) != 1 || len(d.Fallbacks) == 0 || d.Fallbacks[0].Pool != "pool-a" {
		t.Errorf("fallbacks = %+v, want pool-a's best worker first (then pool-b's others)", d.Fallbacks)
	}
	if d.Prefill != nil {
		t.Errorf("aggregated pools gave a prefill endpoint %+v", d.Prefill)
	}
	for _, want := range []string{"pool-a a-", "pool-b b-1/0@", "chain: model-match", "winner pool-b (worker b-1): ranked first by cost"} {
		if !strings.Contains(d.Explanation, want) {
			t.Errorf("explanation lacks %q:\n%s", want, d.Explanation)
		}
	}
	// Committed on pool-b's router only, until freed (the commit is
	// pipelined: it lands shortly after Decide returns).
	if err := c.b.WaitActive(ctx, 1); err != nil {
		t.Errorf("pool-b: %v", err)
	}
	if a, b := c.a.ActiveRequests(), c.b.ActiveRequests(); a != 0 || b != 1 {
		t.Errorf("active requests a=%d b=%d, want 0 and 1", a, b)
	}
	if err := d.Lease.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete: %v", err)
	}
	if err := d.Lease.Free(ctx); err != nil {
		t.Errorf("Free: %v", err)
	}
	if b := c.b.ActiveRequests(); b != 0 {
		t.Errorf("after Free pool-b has %d active requests, want 0", b)
	}

	// Completions and token prompts route too.
	for _, req := range []*globalrouter.Request{
		{Model: model, Prompt: "Say hello."},
		{Model: model, PromptTokens: toks},
	} {
		d, err := r.Decide(ctx, req)
		if err != nil {
			t.Fatalf("Decide(%+v): %v", req, err)
		}
		free(t, d)
	}
}

func TestDecideErrors(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	tests := []struct {
		name string
		req  *globalrouter.Request
		want error
	}{
		{"no model", &globalrouter.Request{Prompt: "x"}, globalrouter.ErrBadRequest},
		{"nil", nil, globalrouter.ErrBadRequest},
		{"unknown model", &globalrouter.Request{Model: "gpt-9", Prompt: "x"}, globalrouter.ErrUnknownModel},
		{"no prompt", &globalrouter.Request{Model: model}, globalrouter.ErrBadRequest},
		{"bad priority", &globalrouter.Request{Model: model, Prompt: "x", Headers: map[string]string{globalrouter.HeaderPriority: "high"}}, globalrouter.ErrBadRequest},
		{"bad override", &globalrouter.Request{Model: model, Prompt: "x", Headers: map[string]string{globalrouter.HeaderRouterTemperature: "-1"}}, globalrouter.ErrBadRequest},
		{"bad ttft", &globalrouter.Request{Model: model, Prompt: "x", Headers: map[string]string{globalrouter.HeaderTTFT: "soon"}}, globalrouter.ErrBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := r.Decide(ctx, tt.req)
			if !errors.Is(err, tt.want) {
				if d != nil {
					free(t, d)
				}
				t.Fatalf("Decide: got %v, want %v", err, tt.want)
			}
		})
	}
	// A good override is passed on.
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "x", Headers: map[string]string{globalrouter.HeaderRouterTemperature: "0.5", globalrouter.HeaderSession: "s"}})
	if err != nil {
		t.Fatalf("Decide with overrides: %v", err)
	}
	free(t, d)
}

func TestStoppedPoolIsSkipped(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	// A fixed probe deadline, the generous one: with the adaptive one (as
	// short as 25 ms) a loaded machine let pool-b's probe run past it, the
	// decision found no pool and probed again, and pool-a's extra refusal
	// opened its circuit one decision early. pool-a's probes fail at once
	// (connection refused), whatever the deadline.
	c.cfg.Probe.MinTimeout = c.cfg.Probe.Timeout
	// A clock that stands still: the circuit stays open whatever the
	// machine's speed.
	now := time.Unix(1000, 0)
	r, _ := newRouter(t, c.cfg, globalrouter.WithClock(func() time.Time { return now }))
	// Both pools answer once: the router knows a worker of each.
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(50)})
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	c.a.Stop()
	// pool-a's circuit opens on its third failure in a row
	// (probe.open_after_failures), not on the first.
	for i := range pool.DefaultCircuitFailures + 1 {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(50), Explain: true})
		if err != nil {
			t.Fatalf("Decide %d with pool-a stopped: %v", i, err)
		}
		if d.Primary.Pool != "pool-b" {
			t.Errorf("Decide %d: primary %s, want pool-b", i, d.Primary.Pool)
		}
		for _, f := range d.Fallbacks {
			if f.Pool != "pool-b" {
				t.Errorf("Decide %d: fallback %+v in a stopped pool", i, f)
			}
		}
		if !strings.Contains(d.Explanation, "pool-a skipped") {
			t.Errorf("Decide %d: explanation does not show pool-a skipped:\n%s", i, d.Explanation)
		}
		if open := strings.Contains(d.Explanation, "circuit open"); open != (i >= pool.DefaultCircuitFailures-1) {
			t.Errorf("Decide %d: explanation says circuit open = %v:\n%s", i, open, d.Explanation)
		}
		free(t, d)
	}
	h := r.Health()
	if len(h) != 2 || h[0].Pool != "pool-a" || h[0].Health.Available != 0 || h[0].Routers[0].State != pool.CircuitOpen {
		t.Errorf("Health = %+v, want pool-a's circuit open", h)
	}
	if h[1].Health.Available != 1 {
		t.Errorf("pool-b health = %+v, want available", h[1])
	}

	// Every pool down: best effort on the workers the probes named, not a
	// blanket 503; nothing is committed anywhere.
	c.b.Stop()
	d, err = r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "x"})
	if err != nil {
		t.Fatalf("Decide with every pool stopped: %v, want a best-effort decision", err)
	}
	if !d.BestEffort || d.Primary.Address == "" || d.Primary.WorkerID == "" {
		t.Errorf("every pool stopped: %+v, want a best-effort decision on a known worker", d)
	}
	free(t, d)

	// A router that never saw a worker has no last known state: 503, the
	// reason names the unreachable pools and no address.
	r2, _ := newRouter(t, c.cfg)
	_, err = r2.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "x"})
	var ref *globalrouter.Refusal
	if !errors.Is(err, globalrouter.ErrNoPool) || !errors.As(err, &ref) {
		t.Fatalf("fresh router, every pool stopped: got %v, want a Refusal of ErrNoPool", err)
	}
	msg := globalrouter.ClientMessage(err)
	if !strings.Contains(msg, "pool-a, pool-b are unreachable") || strings.Contains(msg, "127.0.0.1") || ref.Reason != "no_pool_reachable" {
		t.Errorf("client message %q (reason %q): want the unreachable pools named, no address", msg, ref.Reason)
	}
}

func TestPinning(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	other := pooltest.Start(t, "pool-c", 16, pooltest.Workers("c", 1)...)
	cfg := c.cfg
	cfg.Pools = append(cfg.Pools, pool.NewConfig("pool-c", 16, []string{"other-model"}, other.Addr))
	r, _ := newRouter(t, cfg)
	msgs := chat(longText(100))
	c.b.Store(t, "b-0", chatTokens(t, msgs)) // unpinned, pool-b would win

	pin := func(h map[string]string) (*globalrouter.Decision, error) {
		return r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...), Headers: h})
	}
	d, err := pin(map[string]string{globalrouter.HeaderPool: "pool-a"})
	if err != nil {
		t.Fatalf("pinned to pool-a: %v", err)
	}
	if d.Primary.Pool != "pool-a" || len(otherPools(d)) != 0 {
		t.Errorf("pinned to pool-a: primary %+v fallbacks %+v, want pool-a alone", d.Primary, d.Fallbacks)
	}
	free(t, d)

	d, err = pin(map[string]string{globalrouter.HeaderWorkerID: "a-2"})
	if err != nil {
		t.Fatalf("pinned to worker a-2: %v", err)
	}
	if d.Primary.Pool != "pool-a" || d.Primary.WorkerID != "a-2" || d.Primary.Address == "" {
		t.Errorf("pinned to a-2: primary %+v", d.Primary)
	}
	if n := c.a.ActiveRequests(); n != 1 {
		t.Errorf("pool-a has %d active requests, want 1", n)
	}
	free(t, d)

	d, err = pin(map[string]string{globalrouter.HeaderPool: "pool-b", globalrouter.HeaderWorkerID: "b-1"})
	if err != nil {
		t.Fatalf("pinned to pool-b/b-1: %v", err)
	}
	if d.Primary.WorkerID != "b-1" {
		t.Errorf("pinned to pool-b/b-1: primary %+v", d.Primary)
	}
	free(t, d)

	for name, h := range map[string]map[string]string{
		"unknown pool":           {globalrouter.HeaderPool: "pool-z"},
		"pool not serving model": {globalrouter.HeaderPool: "pool-c"},
		"unknown worker":         {globalrouter.HeaderWorkerID: "z-9"},
		"worker in another pool": {globalrouter.HeaderPool: "pool-b", globalrouter.HeaderWorkerID: "a-0"},
		"bad rank":               {globalrouter.HeaderWorkerID: "a-0", globalrouter.HeaderDPRank: "x"},
		"rank the worker lacks":  {globalrouter.HeaderWorkerID: "a-0", globalrouter.HeaderDPRank: "3"},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := pin(h)
			if !errors.Is(err, globalrouter.ErrPinRefused) {
				if d != nil {
					free(t, d)
				}
				t.Fatalf("got %v, want ErrPinRefused", err)
			}
		})
	}
	if a, b := c.a.ActiveRequests(), c.b.ActiveRequests(); a != 0 || b != 0 {
		t.Errorf("refused pins left requests: a=%d b=%d", a, b)
	}
	// A pinned pool that is down is an outage (503, retry later), never
	// re-routed to the pool that is up.
	c.a.Stop()
	for _, h := range []map[string]string{{globalrouter.HeaderPool: "pool-a"}, {globalrouter.HeaderWorkerID: "a-0"}} {
		d, err := pin(h)
		if d != nil {
			free(t, d)
			t.Fatalf("pinned %v with pool-a down: routed to %+v", h, d.Primary)
		}
		if !errors.Is(err, globalrouter.ErrNoPool) || errors.Is(err, globalrouter.ErrPinRefused) {
			t.Errorf("pinned %v with pool-a down: got %v, want ErrNoPool (an outage, not a refusal)", h, err)
		}
	}
}

// TestDisaggregation: a long prompt gets a prefill worker of the prefill
// pool and a decode worker, both accounted until their part ends, in each
// commit mode that decides (probe.commit: reserve confirms the two
// reservations the decision's probes made and releases none).
func TestDisaggregation(t *testing.T) {
	for _, mode := range []globalrouter.CommitMode{globalrouter.CommitDecide, globalrouter.CommitReserve} {
		t.Run(string(mode), func(t *testing.T) { testDisaggregation(t, mode) })
	}
}

func testDisaggregation(t *testing.T, mode globalrouter.CommitMode) {
	ctx := testenv.Context(t)
	pre := pooltest.Start(t, "prefill", 16, pooltest.Workers("p", 2)...)
	dec := pooltest.Start(t, "decode", 16, pooltest.Workers("d", 2)...)
	pc := pool.NewConfig("prefill", 16, []string{model}, pre.Addr)
	pc.Role = policies.RolePrefill
	dc := pool.NewConfig("decode", 16, []string{model}, dec.Addr)
	dc.Role = policies.RoleDecode
	cfg := globalrouter.DefaultConfig(pc, dc)
	cfg.Probe.Timeout = 10e9
	cfg.Chain = []policies.Spec{{Name: "model-match"}, {Name: "cost"}, {Name: "disaggregate", Args: section(policies.DisaggregateArgs{ThresholdTokens: 256})}}
	cfg.Probe.Commit = mode
	r, _ := newRouter(t, cfg)

	long := chat(longText(300))
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(long...), Explain: true})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if d.Primary.Pool != "decode" || d.Prefill == nil || d.Prefill.Pool != "prefill" || d.Prefill.Address == "" {
		t.Fatalf("long prompt: primary %+v prefill %+v, want decode with a prefill worker\n%s", d.Primary, d.Prefill, d.Explanation)
	}
	if !strings.Contains(d.Explanation, "prefill on prefill/") {
		t.Errorf("explanation lacks the prefill worker:\n%s", d.Explanation)
	}
	for _, srv := range []*pooltest.Server{pre, dec} {
		if err := srv.WaitActive(ctx, 1); err != nil { // pipelined commits
			t.Error(err)
		}
	}
	if p, q := pre.ActiveRequests(), dec.ActiveRequests(); p != 1 || q != 1 {
		t.Errorf("active prefill=%d decode=%d, want 1 and 1", p, q)
	}
	if err := d.Lease.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete: %v", err)
	}
	if p, q := pre.ActiveRequests(), dec.ActiveRequests(); p != 0 || q != 1 {
		t.Errorf("after prefill: active prefill=%d decode=%d, want 0 and 1", p, q)
	}
	free(t, d)
	if q := dec.ActiveRequests(); q != 0 {
		t.Errorf("after Free: decode has %d active, want 0", q)
	}
	if mode == globalrouter.CommitReserve {
		for _, srv := range []*pooltest.Server{pre, dec} {
			if rs := srv.Router.ReservationStats(); rs.Made != 1 || rs.Confirmed != 1 || rs.Held != 0 {
				t.Errorf("%s reservations %+v, want the one made and confirmed", srv.Addr, rs)
			}
		}
	}

	// Once the decode worker caches the prompt, it prefills locally.
	dec.Store(t, d.Primary.WorkerID, chatTokens(t, long))
	d, err = r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(long...)})
	if err != nil {
		t.Fatalf("Decide cached: %v", err)
	}
	if d.Prefill != nil {
		t.Errorf("cached prompt got a prefill worker %+v", d.Prefill)
	}
	free(t, d)
	d, err = r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "short"})
	if err != nil {
		t.Fatalf("Decide short: %v", err)
	}
	if d.Primary.Pool != "decode" || d.Prefill != nil {
		t.Errorf("short prompt: primary %+v prefill %+v, want decode alone", d.Primary, d.Prefill)
	}
	free(t, d)

	// A prefill pool that is down: the decode worker prefills.
	pre.Stop()
	d, err = r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(longText(301))...)})
	if err != nil {
		t.Fatalf("Decide with the prefill pool down: %v", err)
	}
	if d.Primary.Pool != "decode" || d.Prefill != nil {
		t.Errorf("prefill pool down: primary %+v prefill %+v, want decode alone", d.Primary, d.Prefill)
	}
	free(t, d)
}

func TestHeaderMatchAndFailover(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	cfg.Chain = []policies.Spec{{Name: "model-match"}, {Name: "header-match"}, {Name: "cost"}, {Name: "failover"}}
	cfg.Pools[0].Policy = policies.PoolSection{"failover": section(policies.FailoverPool{Tier: 1})}
	cfg.Pools[1].Policy = policies.PoolSection{"header-match": section(policies.HeaderMatchPool{Headers: map[string][]string{"x-tenant": {"acme"}}})}
	r, _ := newRouter(t, cfg)

	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Headers: map[string]string{"x-tenant": "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Primary.Pool != "pool-b" || len(otherPools(d)) != 1 {
		t.Errorf("acme: primary %s fallbacks %+v, want pool-b (tier 0) then pool-a", d.Primary.Pool, d.Fallbacks)
	}
	free(t, d)
	d, err = r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Primary.Pool != "pool-a" || len(otherPools(d)) != 0 {
		t.Errorf("no tenant: primary %s fallbacks %+v, want pool-a alone", d.Primary.Pool, d.Fallbacks)
	}
	free(t, d)
	cfg.Pools[0].Policy = policies.PoolSection{"header-match": section(policies.HeaderMatchPool{Headers: map[string][]string{"x-tenant": {"beta"}}})}
	if err := r.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi"}); !errors.Is(err, globalrouter.ErrNoPool) || !strings.Contains(err.Error(), "header-match") {
		t.Errorf("no pool accepts the headers: got %v, want ErrNoPool naming header-match", err)
	}
}

// shed is a custom policy: it sheds requests of negative priority.
type shed struct{}

func (shed) Name() string { return "shed" }

func (shed) Rank(req *policies.Request, c []policies.Candidate) ([]policies.Candidate, error) {
	if req.Priority < 0 {
		return nil, fmt.Errorf("priority %d: %w", req.Priority, policies.ErrSaturated)
	}
	return c, nil
}

func TestCustomPolicy(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	reg := policies.NewRegistry()
	if err := policies.RegisterBuiltins(reg); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register("shed", func(policies.Args) (policies.Policy, error) { return shed{}, nil }); err != nil {
		t.Fatal(err)
	}
	cfg := c.cfg
	cfg.Chain = []policies.Spec{{Name: "shed"}, {Name: "cost"}}
	r, _ := newRouter(t, cfg, globalrouter.WithPolicies(reg))
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Headers: map[string]string{globalrouter.HeaderPriority: "1"}})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	free(t, d)
	if _, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Headers: map[string]string{globalrouter.HeaderPriority: "-1"}}); !errors.Is(err, globalrouter.ErrSaturated) {
		t.Errorf("shed request: got %v, want ErrSaturated", err)
	}
	// Without the custom registry the chain does not build.
	if _, err := globalrouter.New(cfg, globalrouter.WithLogger(quiet())); !errors.Is(err, policies.ErrConfig) {
		t.Errorf("New with an unregistered policy: got %v, want a configuration error", err)
	}
}
