package localrouterd

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/membership"
)

func TestMembershipFollowsEtcd(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("members")
	cfg.Router.UseKVEvents = false
	// A worker registered before the router starts is listed at start.
	e.putWorker("members", worker("w1"), 0)
	svc, c, _ := e.start(cfg)
	waitWorkers(t, svc, "w1")

	e.putWorker("members", worker("w2"), 0)
	waitWorkers(t, svc, "w1", "w2")

	ctx := testenv.Context(t)
	ws, err := c.Workers(ctx)
	if err != nil {
		t.Fatalf("Workers: %v", err)
	}
	var got []string
	for _, w := range ws {
		got = append(got, w.GetWorkerId()+"@"+w.GetAddress())
	}
	if diff := cmp.Diff([]string{"w1@127.0.0.1:11000", "w2@127.0.0.1:12000"}, got); diff != "" {
		t.Errorf("Workers (-want +got):\n%s", diff)
	}

	// A request on w1 is dropped with w1.
	p := client.TokenPrompt(seqTokens(0, 64))
	if _, err := c.Commit(ctx, "req-1", localrouter.WorkerKey{ID: "w1"}, p); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	e.deleteWorker("members", "w1")
	waitWorkers(t, svc, "w2")
	if err := c.Free(ctx, "req-1"); !errors.Is(err, localrouter.ErrUnknownRequest) {
		t.Errorf("Free of a request of a removed worker = %v, want ErrUnknownRequest", err)
	}
	sel, err := c.BestWorker(ctx, p, client.BestWorkerOptions{})
	if err != nil || sel.WorkerID != "w2" || sel.Address != "127.0.0.1:12000" {
		t.Errorf("BestWorker = %+v, %v; want w2 at 127.0.0.1:12000", sel, err)
	}

	// A registration with another block size is refused.
	bad := worker("w3")
	bad.BlockSize = 32
	e.putWorker("members", bad, 0)
	e.putWorker("members", worker("w4"), 0) // a later change, to know w3 was seen
	waitWorkers(t, svc, "w2", "w4")
}

func TestLeaseExpiryRemovesWorker(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("lease")
	cfg.Router.UseKVEvents = false
	svc, _, _ := e.start(cfg)
	e.putWorker("lease", worker("w1"), 0)
	e.putWorker("lease", worker("w2"), 2) // never kept alive
	waitWorkers(t, svc, "w1", "w2")
	waitWorkers(t, svc, "w1") // the lease expired
}

func TestRouterRegistersItself(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("reg")
	svc, _, _ := e.start(cfg)
	ctx := testenv.Context(t)
	key := membership.RouterKey("reg", cfg.RouterID)
	r, err := e.etcd.Get(ctx, key)
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get %s = %v, %v; want one key", key, r, err)
	}
	info, err := membership.ParseRouterInfo(r.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	want := membership.RouterInfo{ID: cfg.RouterID, GRPCAddress: svc.GRPCAddr(), Pool: "reg", BlockSize: 16}
	if diff := cmp.Diff(want, info); diff != "" {
		t.Errorf("registration (-want +got):\n%s", diff)
	}
	if r.Kvs[0].Lease == 0 {
		t.Errorf("registration has no lease")
	}
	if err := svc.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r, err = e.etcd.Get(ctx, key)
	if err != nil || len(r.Kvs) != 0 {
		t.Errorf("after Close, get %s = %v, %v; want no key", key, r.Kvs, err)
	}
}

func TestEventsAndGapTriggersDump(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("events")
	svc, c, _ := e.start(cfg)
	pub := newTestPublisher(t, e.nc, "events", "w1")
	ctx := testenv.Context(t)

	// Joining triggers a first dump (of nothing yet).
	e.putWorker("events", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		if n := pub.dumpCount(); n < 1 {
			return testenv.Errorf("%d dumps, want 1", n)
		}
		return "", true
	})

	a, b, cc, d := seqTokens(0, 32), seqTokens(32, 32), seqTokens(64, 32), seqTokens(96, 32)
	prompt := client.TokenPrompt(append(append(append(append([]uint32{}, a...), b...), cc...), d...))
	overlap := func(want int) {
		t.Helper()
		testenv.Eventually(t, testTimeout, func() (string, bool) {
			sel, err := c.BestWorker(ctx, prompt, client.BestWorkerOptions{})
			if err != nil || sel.OverlapBlocks != want {
				return testenv.Errorf("BestWorker = %+v, %v; want overlap %d", sel, err, want)
			}
			return "", true
		})
	}
	// Events 1, 2 in order: applied.
	ptr := func(v uint64) *uint64 { return &v }
	pub.store(1, a, 100, nil, false)
	pub.store(2, b, 200, ptr(101), false)
	overlap(4)

	// Event 3 is lost; 4 arrives: a gap, so the router asks for a dump,
	// which holds event 3's blocks.
	pub.store(3, cc, 300, ptr(201), true)
	pub.store(4, d, 400, ptr(301), false)
	overlap(8)
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetEventGaps() < 1 || st.GetDumps() < 2 {
		t.Errorf("stats gaps %d dumps %d; want ≥ 1 and ≥ 2", st.GetEventGaps(), st.GetDumps())
	}

	// DumpEvents rebuilds the same index elsewhere.
	evs, err := c.DumpEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ix, _ := localrouter.NewIndex(16, localrouter.IndexOptions{})
	for _, ev := range evs {
		if err := ix.Apply(ev); err != nil {
			t.Fatalf("apply dumped %+v: %v", ev, err)
		}
	}
	if got := ix.TreeSize(localrouter.WorkerKey{ID: "w1"}); got != 8 {
		t.Errorf("rebuilt tree size %d, want 8", got)
	}
}

func TestMinInitialWorkersGate(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("gate")
	cfg.Router.UseKVEvents = false
	cfg.Router.MinInitialWorkers = 2
	svc, c, _ := e.start(cfg)
	ctx := testenv.Context(t)

	conn, err := grpc.NewClient(svc.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: server.ServiceName})
		if err != nil {
			t.Fatalf("health check: %v", err)
		}
		return r.GetStatus()
	}
	if got := health(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health with no workers = %v, want NOT_SERVING", got)
	}
	p := client.TokenPrompt(seqTokens(0, 32))
	e.putWorker("gate", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	if _, err := c.BestWorker(ctx, p, client.BestWorkerOptions{}); !errors.Is(err, localrouter.ErrNotReady) || err.(*client.Error).Code.String() != "Unavailable" {
		t.Errorf("BestWorker with 1 of 2 workers = %v, want Unavailable ErrNotReady", err)
	}
	if got := health(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health with 1 of 2 workers = %v, want NOT_SERVING", got)
	}
	e.putWorker("gate", worker("w2"), 0)
	waitWorkers(t, svc, "w1", "w2")
	if got := health(); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health with 2 workers = %v, want SERVING", got)
	}
	if _, err := c.BestWorker(ctx, p, client.BestWorkerOptions{}); err != nil {
		t.Errorf("BestWorker when ready: %v", err)
	}
}

func TestApproximateModeLearnsFromCommits(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("approx")
	cfg.Router.UseKVEvents = false
	cfg.NATS = ""
	svc, c, _ := e.start(cfg)
	e.putWorker("approx", worker("w1"), 0)
	e.putWorker("approx", worker("w2"), 0)
	waitWorkers(t, svc, "w1", "w2")
	ctx := testenv.Context(t)
	p := client.TokenPrompt(seqTokens(0, 64))
	sel, err := c.BestWorker(ctx, p, client.BestWorkerOptions{RequestID: "a"})
	if err != nil || sel.OverlapBlocks != 0 {
		t.Fatalf("first BestWorker = %+v, %v; want overlap 0", sel, err)
	}
	if err := c.Free(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	again, err := c.BestWorker(ctx, p, client.BestWorkerOptions{})
	if err != nil || localrouter.Selected(again) != localrouter.Selected(sel) || again.OverlapBlocks != 4 {
		t.Errorf("second BestWorker = %+v, %v; want %v with overlap 4", again, err, localrouter.Selected(sel))
	}
}

func TestBadRequestsGetTheRightCodes(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("bad")
	cfg.Router.UseKVEvents = false
	svc, c, _ := e.start(cfg)
	ctx := testenv.Context(t)
	p := client.TokenPrompt(seqTokens(0, 32))

	// No workers yet.
	if _, err := c.BestWorker(ctx, p, client.BestWorkerOptions{}); code(err) != "Unavailable" || !errors.Is(err, localrouter.ErrNoWorkers) {
		t.Errorf("BestWorker with no workers = %v, want Unavailable ErrNoWorkers", err)
	}
	e.putWorker("bad", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	if _, err := c.Commit(ctx, "dup", localrouter.WorkerKey{ID: "w1"}, p); err != nil {
		t.Fatal(err)
	}
	neg := -1.0
	tests := []struct {
		name     string
		call     func() error
		code     string
		sentinel error
		contains string
	}{
		{"empty prompt", func() error { _, err := c.BestWorker(ctx, client.Prompt{}, client.BestWorkerOptions{}); return err },
			"InvalidArgument", localrouter.ErrEmptyRequest, ""},
		{"wrong block size", func() error {
			_, err := c.BestWorker(ctx, client.HashPrompt([]uint64{1, 2}, 32), client.BestWorkerOptions{})
			return err
		}, "InvalidArgument", localrouter.ErrBlockSizeMismatch, "block size 32, the pool's block size is 16"},
		{"hashes without block size", func() error {
			_, err := c.PotentialLoads(ctx, client.HashPrompt([]uint64{1, 2}, 0))
			return err
		}, "InvalidArgument", nil, "block_size"},
		{"tokens with wrong block size", func() error {
			_, err := c.PotentialLoads(ctx, client.Prompt{Tokens: seqTokens(0, 64), BlockSize: 64})
			return err
		}, "InvalidArgument", localrouter.ErrBlockSizeMismatch, "64"},
		{"bad override", func() error {
			_, err := c.BestWorker(ctx, p, client.BestWorkerOptions{Override: &routing.Override{RouterTemperature: &neg}})
			return err
		}, "InvalidArgument", localrouter.ErrInvalidConfig, "router_temperature"},
		{"free unknown request", func() error { return c.Free(ctx, "nope") }, "NotFound", localrouter.ErrUnknownRequest, "nope"},
		{"prefill unknown request", func() error { return c.MarkPrefillComplete(ctx, "nope") }, "NotFound", localrouter.ErrUnknownRequest, ""},
		{"free without id", func() error { return c.Free(ctx, "") }, "InvalidArgument", localrouter.ErrEmptyRequestID, ""},
		{"commit to unknown worker", func() error {
			_, err := c.Commit(ctx, "x", localrouter.WorkerKey{ID: "ghost"}, p)
			return err
		}, "NotFound", localrouter.ErrUnknownWorker, "ghost"},
		{"commit to unknown rank", func() error {
			_, err := c.Commit(ctx, "x", localrouter.WorkerKey{ID: "w1", DPRank: 3}, p)
			return err
		}, "NotFound", localrouter.ErrUnknownWorker, ""},
		{"commit without id", func() error {
			_, err := c.Commit(ctx, "", localrouter.WorkerKey{ID: "w1"}, p)
			return err
		}, "InvalidArgument", localrouter.ErrEmptyRequestID, ""},
		{"duplicate request id", func() error {
			_, err := c.Commit(ctx, "dup", localrouter.WorkerKey{ID: "w1"}, p)
			return err
		}, "AlreadyExists", localrouter.ErrDuplicateRequest, ""},
		{"track unknown worker", func() error {
			_, err := c.Track(ctx, "t", localrouter.WorkerKey{ID: "ghost"}, p)
			return err
		}, "NotFound", localrouter.ErrUnknownWorker, ""},
		{"attach unknown request", func() error { _, err := c.Attach(ctx, "nope"); return err }, "NotFound", localrouter.ErrUnknownRequest, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if got := code(err); got != tt.code {
				t.Errorf("code = %s (%v), want %s", got, err, tt.code)
			}
			if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
				t.Errorf("error %v is not %v", err, tt.sentinel)
			}
			if err != nil && !strings.Contains(err.Error(), tt.contains) {
				t.Errorf("error %q does not contain %q", err, tt.contains)
			}
		})
	}
}

func code(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Code.String()
	}
	if err == nil {
		return "OK"
	}
	return "not a status: " + err.Error()
}

func TestReflectionListsTheServices(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("refl")
	cfg.Router.UseKVEvents = false
	svc, _, _ := e.start(cfg)
	conn, err := grpc.NewClient(svc.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		got = append(got, s.GetName())
	}
	for _, want := range []string{server.ServiceName, "grpc.health.v1.Health"} {
		if !slices.Contains(got, want) {
			t.Errorf("reflection lists %v, want %s among them", got, want)
		}
	}
	_ = stream.CloseSend()
}

// TestStaleWorkerGetsNoRequests (issue 13 item 5): a worker whose record is
// marked stale (it cannot publish KV events) stays a member, its requests
// still counted, but is not chosen while a fresh worker is left; cleared,
// it is chosen again.
func TestStaleWorkerGetsNoRequests(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("stale")
	cfg.Router.UseKVEvents = false
	svc, c, _ := e.start(cfg)
	e.putWorker("stale", worker("w1"), 0)
	e.putWorker("stale", worker("w2"), 0)
	waitWorkers(t, svc, "w1", "w2")
	ctx := testenv.Context(t)
	p := client.TokenPrompt(seqTokens(0, 64))
	if _, err := c.Commit(ctx, "req-1", localrouter.WorkerKey{ID: "w1"}, p); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	stale := worker("w1")
	stale.Stale = true
	e.putWorker("stale", stale, 0)
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		return "w1 not marked stale", svc.Router().WorkerStale("w1")
	})
	for i := range 10 {
		sel, err := c.BestWorker(ctx, client.TokenPrompt(seqTokens(i*1000, 64)), client.BestWorkerOptions{})
		if err != nil || sel.WorkerID != "w2" {
			t.Fatalf("BestWorker with w1 stale = %+v, %v; want w2", sel, err)
		}
	}
	if err := c.Free(ctx, "req-1"); err != nil {
		t.Errorf("Free of a stale worker's request: %v, want nil (still counted)", err)
	}
	e.putWorker("stale", worker("w1"), 0)
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		return "w1 still stale", !svc.Router().WorkerStale("w1")
	})
	waitWorkers(t, svc, "w1", "w2")
}
