package pool_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// clock is a manual clock for circuits.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func tokens(n int, seed uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*100000 + uint32(i)
	}
	return out
}

func prompt(t *testing.T, toks []uint32, bs int) pool.Prompt {
	t.Helper()
	h, err := kvevents.LocalHashes(toks, bs, "")
	if err != nil {
		t.Fatal(err)
	}
	return pool.Prompt{Hashes: h, BlockSize: bs, ISL: len(toks), Tokens: toks}
}

// open opens a pool over static routers with a generous probe timeout:
// these tests are about behaviour, not speed.
func open(t *testing.T, conns *pool.Conns, name string, addrs ...string) *pool.Pool {
	t.Helper()
	p, err := pool.Open(pool.NewConfig(name, 16, []string{"m"}, addrs...), pool.Options{Conns: conns, ProbeTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// newConns returns clients whose circuits open on the first failure
// (Failures: 1) with a 1 s backoff doubling to 4 s, unless opts say
// otherwise.
func newConns(t *testing.T, clk *clock, opts ...pool.CircuitOptions) *pool.Conns {
	var now func() time.Time
	if clk != nil {
		now = clk.Now
	}
	// Reconnect fast: the circuit test brings a router back.
	dial := pool.GRPCDialer(grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1, MaxDelay: 5 * time.Millisecond}, MinConnectTimeout: time.Second}))
	o := pool.CircuitOptions{Base: time.Second, Max: 4 * time.Second, Failures: 1}
	if len(opts) > 0 {
		o = opts[0]
	}
	c := pool.NewConns(dial, o, now)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestProbeAndTrack(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 3)...)
	toks := tokens(100, 1)
	srv.Store(t, "w-1", toks[:64])
	conns := newConns(t, nil)
	p := open(t, conns, "p", srv.Addr)

	sel, err := p.Probe(ctx, prompt(t, toks, 16))
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if sel.WorkerID != "w-1" || sel.OverlapBlocks != 4 || sel.RequestBlocks != 6 || sel.BlockSize != 16 || sel.Candidates != 3 || sel.Router != srv.Addr {
		t.Errorf("Probe = %+v, want w-1 with 4/6 blocks of 16 out of 3 workers via %s", sel, srv.Addr)
	}
	if sel.Address == "" {
		t.Error("Probe gave no worker address")
	}
	if n := srv.ActiveRequests(); n != 0 {
		t.Fatalf("a probe changed state: %d active requests, want 0", n)
	}

	tr, csel, err := p.Commit(ctx, sel.Router, pool.Commit{RequestID: "r1", WorkerID: "w-2", Prompt: prompt(t, toks, 16)})
	if err != nil {
		t.Fatalf("Track: %v", err)
	}
	if csel.WorkerID != "w-2" {
		t.Errorf("commit went to %q, want the forced w-2", csel.WorkerID)
	}
	if n := srv.ActiveRequests(); n != 1 {
		t.Errorf("after commit: %d active requests, want 1", n)
	}
	if err := tr.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete: %v", err)
	}
	if err := tr.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete again: %v", err)
	}
	if err := tr.Free(ctx); err != nil {
		t.Errorf("Free: %v", err)
	}
	if n := srv.ActiveRequests(); n != 0 {
		t.Errorf("after Free: %d active requests, want 0", n)
	}
	if err := tr.Free(ctx); err != nil {
		t.Errorf("Free again: %v", err)
	}
	if err := tr.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete after Free: %v", err)
	}

	// A short prompt has no complete block: its tokens go on the wire.
	if _, err := p.Probe(ctx, prompt(t, tokens(5, 2), 16)); err != nil {
		t.Errorf("Probe of a 5-token prompt: %v", err)
	}
	// Unknown worker: the commit is refused and nothing leaks.
	if _, _, err := p.Commit(ctx, "", pool.Commit{RequestID: "r2", WorkerID: "nope", Prompt: prompt(t, toks, 16)}); err == nil || !strings.Contains(err.Error(), "UNKNOWN_WORKER") && !strings.Contains(err.Error(), "unknown worker") {
		t.Errorf("Track on an unknown worker: got %v, want unknown worker", err)
	}
	// Pipelined: Commit returns before the answer, which comes to the
	// listener; a refused commit's tracker still frees.
	answers := make(chan error, 2)
	listen := func(sel routing.Selection, err error) {
		if err == nil && sel.Router != srv.Addr {
			err = fmt.Errorf("answer from %q, want %q", sel.Router, srv.Addr)
		}
		answers <- err
	}
	ok, err := p.CommitAsync(ctx, sel.Router, pool.Commit{RequestID: "r3", WorkerID: "w-0", Prompt: prompt(t, toks, 16)}, listen)
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if err := <-answers; err != nil {
		t.Errorf("Commit answer: %v", err)
	}
	bad, err := p.CommitAsync(ctx, sel.Router, pool.Commit{RequestID: "r4", WorkerID: "nope", Prompt: prompt(t, toks, 16)}, listen)
	if err != nil {
		t.Fatalf("Commit on an unknown worker: got %v, want the refusal on the listener", err)
	}
	if err := <-answers; err == nil || !strings.Contains(err.Error(), "UNKNOWN_WORKER") && !strings.Contains(err.Error(), "unknown worker") {
		t.Errorf("Commit answer on an unknown worker: got %v, want unknown worker", err)
	}
	if err := bad.Free(ctx); err != nil {
		t.Errorf("Free of a refused commit: %v", err)
	}
	if err := ok.Free(ctx); err != nil {
		t.Errorf("Free: %v", err)
	}
	if n := srv.ActiveRequests(); n != 0 {
		t.Errorf("after Free: %d active requests, want 0", n)
	}
}

func TestTrackStreamBreakFrees(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 2)...)
	conns := newConns(t, nil)
	p := open(t, conns, "p", srv.Addr)
	tr, _, err := p.Commit(ctx, "", pool.Commit{RequestID: "r1", WorkerID: "w-0", Prompt: prompt(t, tokens(40, 1), 16)})
	if err != nil {
		t.Fatalf("Track: %v", err)
	}
	// The pool goes (a reload); the tracker keeps its connection.
	p.Close()
	if n := conns.Len(); n != 1 {
		t.Fatalf("after pool Close with an open tracker: %d clients, want 1", n)
	}
	if n := srv.ActiveRequests(); n != 1 {
		t.Fatalf("after pool Close: %d active, want 1 (the request is in flight)", n)
	}
	// Closing every client breaks the stream: the router frees the request.
	if err := conns.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := srv.WaitIdle(ctx); err != nil {
		t.Fatalf("after the stream broke: %v", err)
	}
	if err := tr.Free(ctx); err != nil {
		t.Logf("Free of a broken stream: %v", err)
	}
	if n := conns.Len(); n != 0 {
		t.Errorf("after Free: %d clients, want 0", n)
	}
}

func TestCircuit(t *testing.T) {
	ctx := testenv.Context(t)
	clk := &clock{now: time.Unix(1000, 0)}
	workers := pooltest.Workers("w", 2)
	srv := pooltest.Start(t, "p", 16, workers...)
	addr := srv.Addr
	conns := newConns(t, clk)
	p := open(t, conns, "p", addr)
	pr := prompt(t, tokens(40, 1), 16)

	if _, err := p.Probe(ctx, pr); err != nil {
		t.Fatalf("Probe of a live router: %v", err)
	}
	if h := p.Health(); h.Routers != 1 || h.Available != 1 || h.Recovering {
		t.Errorf("live Health = %+v, want 1/1", h)
	}

	srv.Stop()
	_, err := p.Probe(ctx, pr)
	var pe *pool.ProbeError
	if !errors.As(err, &pe) || pe.Backoff != time.Second || pe.Router != addr {
		t.Fatalf("Probe of a stopped router: got %v, want a ProbeError opening the circuit for 1s", err)
	}
	if h := p.Health(); h.Available != 0 {
		t.Errorf("Health after failure = %+v, want 0 available", h)
	}
	if st := p.Routers()[0]; st.State != pool.CircuitOpen || st.Failures != 1 {
		t.Errorf("router status = %+v, want open after 1 failure", st)
	}
	if _, err := p.Probe(ctx, pr); !errors.Is(err, pool.ErrCircuitOpen) {
		t.Fatalf("Probe with the circuit open: got %v, want ErrCircuitOpen", err)
	}

	// The backoff ends: one trial probe goes out, fails, and the backoff
	// doubles.
	clk.Advance(time.Second)
	if h := p.Health(); !h.Recovering || h.Available != 1 {
		t.Errorf("Health after the backoff = %+v, want recovering", h)
	}
	if _, err := p.Probe(ctx, pr); !errors.As(err, &pe) || pe.Backoff != 2*time.Second {
		t.Fatalf("trial Probe: got %v, want a failure with a 2s backoff", err)
	}

	// The router comes back on the same address; after the backoff the
	// trial succeeds and closes the circuit.
	// gRPC reconnects on its own backoff, so poll: each round ends the
	// circuit's backoff and lets one trial through.
	pooltest.StartOn(t, addr, "p", 16, workers...)
	testenv.Eventually(t, 20*time.Second, func() (string, bool) {
		clk.Advance(4 * time.Second)
		if _, err := p.Probe(ctx, pr); err != nil {
			return testenv.Errorf("trial Probe of the restarted router: %v", err)
		}
		return "", true
	})
	if st := p.Routers()[0]; st.State != pool.CircuitClosed || st.Failures != 0 {
		t.Errorf("router status = %+v, want closed", st)
	}
}

// TestCommitEndsHalfOpenTrial: a commit that is not preceded by a probe (a
// pinned worker) may take a half-open circuit's one trial; its outcome must
// close or reopen the circuit, never leave it half-open with the trial
// taken (which would refuse the router for good).
func TestCommitEndsHalfOpenTrial(t *testing.T) {
	ctx := testenv.Context(t)
	clk := &clock{now: time.Unix(1000, 0)}
	workers := pooltest.Workers("w", 2)
	srv := pooltest.Start(t, "p", 16, workers...)
	addr := srv.Addr
	p := open(t, newConns(t, clk), "p", addr)
	pr := prompt(t, tokens(40, 1), 16)
	srv.Stop()
	if _, err := p.Probe(ctx, pr); err == nil {
		t.Fatal("Probe of a stopped router succeeded")
	}
	pooltest.StartOn(t, addr, "p", 16, workers...)
	// Pinned-style commits (no router address) until one gets through the
	// half-open circuit; gRPC reconnects on its own backoff.
	n := 0
	testenv.Eventually(t, 20*time.Second, func() (string, bool) {
		clk.Advance(20 * time.Second)
		n++
		tr, _, err := p.Commit(ctx, "", pool.Commit{RequestID: fmt.Sprint("r", n), WorkerID: workers[0].ID, Prompt: pr})
		if err != nil {
			return testenv.Errorf("pinned commit: %v", err)
		}
		_ = tr.Free(ctx)
		return "", true
	})
	if st := p.Routers()[0]; st.State != pool.CircuitClosed {
		t.Fatalf("router status after a successful pinned commit = %+v, want closed", st)
	}
	if _, err := p.Probe(ctx, pr); err != nil {
		t.Errorf("Probe after the pinned commit: %v", err)
	}
}

// TestRequestFaultKeepsCircuitClosed: a router that refuses one request as
// malformed (here: hashes for another block size) is up; its circuit stays
// closed for everyone else.
func TestRequestFaultKeepsCircuitClosed(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 2)...)
	p := open(t, newConns(t, &clock{now: time.Unix(1000, 0)}), "p", srv.Addr)
	if _, err := p.Probe(ctx, prompt(t, tokens(64, 1), 32)); err == nil {
		t.Fatal("Probe with hashes for block size 32 on a 16-token pool succeeded")
	}
	if st := p.Routers()[0]; st.State != pool.CircuitClosed || st.Failures != 0 {
		t.Errorf("router status after a request fault = %+v, want closed", st)
	}
	if _, err := p.Probe(ctx, prompt(t, tokens(64, 1), 16)); err != nil {
		t.Errorf("next Probe: %v", err)
	}
}

func TestNoRouters(t *testing.T) {
	conns := newConns(t, nil)
	_, err := pool.Open(pool.Config{Name: "p", Routers: pool.Routers{Etcd: true}}, pool.Options{Conns: conns})
	if err == nil || !strings.Contains(err.Error(), "no etcd client") {
		t.Errorf("Open with etcd discovery and no client: got %v", err)
	}
	if _, err := pool.Open(pool.Config{}, pool.Options{}); err == nil {
		t.Error("Open without Conns: no error")
	}
}

func TestEtcdDiscovery(t *testing.T) {
	ctx := testenv.Context(t)
	_, cli := testenv.StartEtcd(t)
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 2)...)
	conns := newConns(t, nil)
	cfg := pool.Config{Name: "p", Models: []string{"m"}, Routers: pool.Routers{Etcd: true}}
	cfg.Defaults()
	p, err := pool.Open(cfg, pool.Options{Conns: conns, Etcd: cli, ProbeTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer p.Close()
	select {
	case <-p.Synced():
	case <-ctx.Done():
		t.Fatal("discovery never synced")
	}
	if _, err := p.Probe(ctx, prompt(t, tokens(40, 1), 16)); !errors.Is(err, pool.ErrNoRouters) {
		t.Fatalf("Probe before any router registered: got %v, want ErrNoRouters", err)
	}
	put := func(key, value string) {
		if _, err := cli.Put(ctx, key, value); err != nil {
			t.Fatal(err)
		}
	}
	key := membership.RouterKey("p", "r1")
	// A router of another block size is ignored.
	put(membership.RouterKey("p", "r2"), `{"id":"r2","grpc_address":"127.0.0.1:1","pool":"p","block_size":64}`)
	put(key, `{"id":"r1","grpc_address":"`+srv.Addr+`","pool":"p","block_size":16}`)
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		if h := p.Health(); h.Routers != 1 {
			return testenv.Errorf("routers = %d, want 1", h.Routers)
		}
		return "", true
	})
	if _, err := p.Probe(ctx, prompt(t, tokens(40, 1), 16)); err != nil {
		t.Fatalf("Probe of the discovered router: %v", err)
	}
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		h := p.Health()
		if h.Routers == 0 {
			return "", true
		}
		return testenv.Errorf("routers = %d, want 0", h.Routers)
	})
}

func openB(b *testing.B, conns *pool.Conns, addr string) *pool.Pool {
	p, err := pool.Open(pool.NewConfig("p", 16, []string{"m"}, addr), pool.Options{Conns: conns, ProbeTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

func promptB(b *testing.B, toks []uint32) pool.Prompt {
	h, err := kvevents.LocalHashes(toks, 16, "")
	if err != nil {
		b.Fatal(err)
	}
	return pool.Prompt{Hashes: h, BlockSize: 16, ISL: len(toks)}
}
