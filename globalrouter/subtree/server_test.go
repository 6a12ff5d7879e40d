package subtree_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/subtree"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

const model = "llama-3-8b"

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func loadTokenizer(t testing.TB) globalrouter.Tokenizer {
	t.Helper()
	cfg := globalrouter.DefaultTokenizer
	cfg.Logger = quiet()
	tok, err := tokenizer.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func newRouter(t testing.TB, cfg globalrouter.Config, tok globalrouter.Tokenizer, opts ...globalrouter.Option) *globalrouter.Router {
	t.Helper()
	cfg.Probe.Timeout = 10 * time.Second // behaviour on a shared machine, not speed
	cfg.Trust.Steering, cfg.Trust.RoutingHeaders = globalrouter.AccessOn, globalrouter.AccessOn
	r, err := globalrouter.New(cfg, append([]globalrouter.Option{globalrouter.WithLogger(quiet()), globalrouter.WithTokenizer(model, tok)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// serve serves r's subtree on lis until the test ends.
func serve(t testing.TB, r *globalrouter.Router, lis net.Listener) *subtree.Server {
	t.Helper()
	s := subtree.NewServer(r.Subtree(), "region", "region-router", quiet())
	g := grpc.NewServer(server.TransportOptions()...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return s
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// region is two pools of real local routers under a region router whose
// subtree is served over gRPC at addr.
type region struct {
	a, b   *pooltest.Server
	router *globalrouter.Router
	srv    *subtree.Server
	addr   string
}

func newRegion(t testing.TB, tok globalrouter.Tokenizer) *region {
	t.Helper()
	rg := &region{a: pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 2)...), b: pooltest.Start(t, "pool-b", 16, pooltest.Workers("b", 2)...)}
	rg.router = newRouter(t, globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{model}, rg.a.Addr),
		pool.NewConfig("pool-b", 16, []string{model}, rg.b.Addr)), tok)
	lis := listen(t)
	rg.addr = lis.Addr().String()
	rg.srv = serve(t, rg.router, lis)
	return rg
}

func (rg *region) active() int { return rg.a.ActiveRequests() + rg.b.ActiveRequests() }

func (rg *region) waitIdle(t testing.TB, ctx context.Context) {
	t.Helper()
	if err := rg.a.WaitIdle(ctx); err != nil {
		t.Errorf("pool-a: %v", err)
	}
	if err := rg.b.WaitIdle(ctx); err != nil {
		t.Errorf("pool-b: %v", err)
	}
}

func dial(t testing.TB, addr string) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func hashes(t testing.TB, tok globalrouter.Tokenizer, text string) ([]uint32, client.Prompt) {
	t.Helper()
	toks, err := tok.Encode(text)
	if err != nil {
		t.Fatal(err)
	}
	h, err := kvevents.LocalHashes(toks, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	return toks, client.HashPrompt(h, 16)
}

func long(words int) string {
	var b strings.Builder
	for i := range words {
		b.WriteString("word")
		b.WriteByte(byte('a' + i%26))
		b.WriteByte(byte('a' + i/26%26))
		b.WriteByte(' ')
	}
	return b.String()
}

// A parent global router whose pool is the region, over real gRPC (its
// default channel dialer): the decision reaches the worker that caches the
// prompt two floors down, and the lease frees it there.
func TestParentDecidesThroughTheSubtreeService(t *testing.T) {
	ctx := testenv.Context(t)
	tok := loadTokenizer(t)
	rg := newRegion(t, tok)
	top := newRouter(t, globalrouter.DefaultConfig(pool.NewConfig("region-1", 16, []string{model}, rg.addr)), tok)
	text := long(300)
	toks, _ := hashes(t, tok, text)
	rg.b.Store(t, "b-1", toks)

	d, err := top.Decide(ctx, &globalrouter.Request{ID: "r1", Model: model, PromptTokens: toks, Explain: true})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if d.Primary.Pool != "region-1" || d.Primary.WorkerID != "pool-b/b-1" || d.Primary.OverlapBlocks != len(toks)/16 {
		t.Fatalf("primary = %+v, want region-1 pool-b/b-1 with %d blocks cached\n%s", d.Primary, len(toks)/16, d.Explanation)
	}
	if err := rg.b.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := rg.a.ActiveRequests(); n != 0 {
		t.Errorf("pool-a has %d requests", n)
	}
	if err := d.Lease.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete: %v", err)
	}
	if err := d.Lease.Free(ctx); err != nil {
		t.Errorf("Free: %v", err)
	}
	rg.waitIdle(t, ctx)
	if rg.srv.Active() != 0 {
		t.Errorf("the subtree service counts %d requests after Free", rg.srv.Active())
	}

	// Break means free: requests committed on the parent's channel are
	// freed below when the parent goes away.
	for i := range 3 {
		d, err := top.Decide(ctx, &globalrouter.Request{ID: "held-" + string(rune('a'+i)), Model: model, PromptTokens: toks})
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		_ = d
	}
	if err := rg.b.WaitActive(ctx, 3); err != nil && rg.active() != 3 {
		t.Fatalf("3 requests held: %v (active %d)", err, rg.active())
	}
	_ = top.Close()
	rg.waitIdle(t, ctx)
}

func TestServiceCalls(t *testing.T) {
	ctx := testenv.Context(t)
	tok := loadTokenizer(t)
	rg := newRegion(t, tok)
	c := dial(t, rg.addr)
	toks, p := hashes(t, tok, long(200))
	rg.a.Store(t, "a-1", toks)

	sel, err := c.BestWorker(ctx, p, client.BestWorkerOptions{})
	if err != nil || sel.WorkerID != "pool-a/a-1" || sel.Candidates != 4 || sel.BlockSize != 16 {
		t.Fatalf("BestWorker = %+v, %v; want pool-a/a-1 of 4 candidates", sel, err)
	}
	loads, err := c.PotentialLoads(ctx, p)
	if err != nil || len(loads) != 4 {
		t.Fatalf("PotentialLoads = %d loads, %v; want 4", len(loads), err)
	}
	for _, l := range loads {
		if !strings.HasPrefix(l.Worker.ID, "pool-a/") && !strings.HasPrefix(l.Worker.ID, "pool-b/") {
			t.Errorf("load of %q: not qualified by its pool", l.Worker.ID)
		}
	}

	// The manual lifecycle: Commit, MarkPrefillComplete, Free.
	if _, err := c.Commit(ctx, "m1", localrouter.WorkerKey{ID: "pool-b/b-0"}, p); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if rg.b.ActiveRequests() != 1 || rg.srv.Active() != 1 {
		t.Errorf("after Commit: pool-b %d, service %d; want 1, 1", rg.b.ActiveRequests(), rg.srv.Active())
	}
	if _, err := c.Commit(ctx, "m1", localrouter.WorkerKey{ID: "pool-b/b-0"}, p); status.Code(err) != codes.AlreadyExists && !errors.Is(err, localrouter.ErrDuplicateRequest) {
		t.Errorf("a second commit of m1: %v, want ALREADY_EXISTS", err)
	}
	if err := c.MarkPrefillComplete(ctx, "m1"); err != nil {
		t.Errorf("MarkPrefillComplete: %v", err)
	}
	if err := c.Free(ctx, "m1"); err != nil {
		t.Errorf("Free: %v", err)
	}
	if err := c.Free(ctx, "m1"); !errors.Is(err, localrouter.ErrUnknownRequest) {
		t.Errorf("Free again: %v, want unknown request", err)
	}
	// Decide-and-commit (no worker): the subtree chooses a-1.
	dsel, err := c.Commit(ctx, "m2", localrouter.WorkerKey{}, p)
	if err != nil || dsel.WorkerID != "pool-a/a-1" {
		t.Errorf("decide-and-commit = %+v, %v; want pool-a/a-1", dsel, err)
	}
	if err := c.Free(ctx, "m2"); err != nil {
		t.Errorf("Free m2: %v", err)
	}
	if _, err := c.Commit(ctx, "m3", localrouter.WorkerKey{ID: "nowhere/b-0"}, p); !errors.Is(err, localrouter.ErrUnknownWorker) {
		t.Errorf("commit on an unknown pool: %v, want unknown worker", err)
	}

	// A Track stream: freed below when it breaks.
	tr, err := c.CommitAsync(ctx, "t1", localrouter.WorkerKey{ID: "pool-a/a-0"}, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rg.a.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := tr.Free(ctx); err != nil {
		t.Errorf("Track free: %v", err)
	}
	rg.waitIdle(t, ctx)

	// A Channel: commits and events, then the stream breaks with requests
	// still committed: they are freed below.
	ch := c.Channel(client.ChannelOptions{})
	// (a-0 held t1's blocks too: either of pool-a's workers caches them.)
	if s, err := ch.BestWorker(ctx, p, client.BestWorkerOptions{}); err != nil || !strings.HasPrefix(s.WorkerID, "pool-a/") || s.OverlapBlocks != len(toks)/16 {
		t.Errorf("channel probe = %+v, %v", s, err)
	}
	done := make(chan error, 2)
	t1, err := ch.CommitAsync(ctx, "c1", localrouter.WorkerKey{ID: "pool-a/a-1"}, p, func(_ routing.Selection, err error) { done <- err })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.CommitAsync(ctx, "c2", localrouter.WorkerKey{ID: "pool-b/b-1"}, p, func(_ routing.Selection, err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("channel commit: %v", err)
		}
	}
	if err := t1.PrefillComplete(ctx); err != nil {
		t.Errorf("channel prefill complete: %v", err)
	}
	if n := rg.active(); n != 2 {
		t.Errorf("%d requests below, want 2", n)
	}
	_ = ch.Close()
	rg.waitIdle(t, ctx)
	deadline := time.Now().Add(5 * time.Second)
	for rg.srv.Active() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if rg.srv.Active() != 0 {
		t.Errorf("the service counts %d requests after the channel broke", rg.srv.Active())
	}

	// Health, Stats.
	conn, err := grpc.NewClient(rg.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: subtree.ServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, %v", h, err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.GetPool() != "region" || st.GetActiveRequests() != 0 {
		t.Errorf("Stats = %v, %v", st, err)
	}
}

func TestHopMetadata(t *testing.T) {
	ctx := testenv.Context(t)
	tok := loadTokenizer(t)
	rg := newRegion(t, tok)
	c := dial(t, rg.addr)
	_, p := hashes(t, tok, long(50))
	with := func(v string) context.Context { return metadata.AppendToOutgoingContext(ctx, pool.HopsMetadata, v) }
	if _, err := c.BestWorker(with("7"), p, client.BestWorkerOptions{}); err != nil {
		t.Errorf("hop 7 of 8: %v", err)
	}
	_, err := c.BestWorker(with("8"), p, client.BestWorkerOptions{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "routing loop or tree deeper than 8") {
		t.Errorf("hop 8: %v, want FAILED_PRECONDITION routing loop or tree deeper than 8", err)
	}
	if _, err := c.Commit(with("8"), "x", localrouter.WorkerKey{ID: "pool-a/a-0"}, p); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("commit at hop 8: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := c.BestWorker(with("many"), p, client.BestWorkerOptions{}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), pool.HopsMetadata) {
		t.Errorf("a malformed hop count: %v, want INVALID_ARGUMENT naming %s", err, pool.HopsMetadata)
	}
	if rg.active() != 0 {
		t.Error("a refused call changed state")
	}
}

// Two routers serving their subtrees, each the other's pool, over gRPC:
// neither configuration shows the loop; the hop count, carried on each
// call's metadata, ends it.
func TestLoopOverGRPC(t *testing.T) {
	ctx := testenv.Context(t)
	tok := loadTokenizer(t)
	la, lb := listen(t), listen(t)
	a := newRouter(t, globalrouter.DefaultConfig(pool.NewConfig("to-b", 16, []string{model}, lb.Addr().String())), tok)
	b := newRouter(t, globalrouter.DefaultConfig(pool.NewConfig("to-a", 16, []string{model}, la.Addr().String())), tok)
	serve(t, a, la)
	serve(t, b, lb)
	c := dial(t, la.Addr().String())
	_, p := hashes(t, tok, long(50))
	_, err := c.BestWorker(ctx, p, client.BestWorkerOptions{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "routing loop or tree deeper than 8") {
		t.Fatalf("probe of a loop: %v, want FAILED_PRECONDITION routing loop", err)
	}
	// From a top-level decision: the loop is named, not an outage.
	_, err = a.Decide(ctx, &globalrouter.Request{ID: "r", Model: model, Prompt: long(50)})
	if err == nil || !strings.Contains(err.Error(), "routing loop") {
		t.Errorf("Decide over the loop: %v", err)
	}
}
