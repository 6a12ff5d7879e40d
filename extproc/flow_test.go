package extproc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/internal/status"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/signals"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// flowRouter is the real global router with flow control over one real
// local router (gRPC, pooltest) of one worker: the pool is saturated
// while more than 100 prompt tokens wait to prefill on it. Each of more
// changes the configuration before the router is made.
func flowRouter(t *testing.T, deadline time.Duration, more ...func(*globalrouter.Config)) (*globalrouter.Router, *pooltest.Server) {
	t.Helper()
	lr := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 1)...)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{"m"}, lr.Addr))
	cfg.Probe.Timeout, cfg.Probe.MinTimeout = 10*time.Second, 10*time.Second
	cfg.Trust.Steering = globalrouter.AccessOn
	cfg.Tenancy.Header, cfg.Tenancy.Identity = "x-tenant", globalrouter.IdentityOn
	cfg.FlowControl = flowcontrol.Config{Enabled: true, Deadline: deadline, Reprobe: 20 * time.Millisecond,
		Saturation: flowcontrol.Saturation{MaxPrefillTokens: 100}}
	for _, f := range more {
		f(&cfg)
	}
	r, err := globalrouter.New(cfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, lr
}

func waiting(r *globalrouter.Router) int {
	n := 0
	for _, q := range r.FlowQueues() {
		for _, b := range q.Bands {
			n += b.Requests
		}
	}
	return n
}

func waitWaiting(t *testing.T, r *globalrouter.Router, n int) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() (string, bool) {
		got := waiting(r)
		return "requests waiting in the flow-control queue: got " + itoa(got) + ", want " + itoa(n), got == n
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// open sends a request's headers and body without reading the answer.
func open(t *testing.T, ctx context.Context, c *extprocclient.Client, body string, extra ...extprocclient.HeaderField) *extprocclient.Stream {
	t.Helper()
	s := c.Open(ctx, nil)
	if err := s.SendRequestHeaders(ctx, post("/v1/completions", extra...), false); err != nil {
		t.Fatal(err)
	}
	if err := s.SendRequestData(ctx, []byte(body), true); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFlowControlWaitsThenServes: with the one worker busy prefilling,
// the next request waits on its ext_proc stream instead of a 429 and is
// routed once the first request's prefill is done; a waiting client that
// goes away leaves the queue at once; nothing stays in flight after.
func TestFlowControlWaitsThenServes(t *testing.T) {
	ctx := testenv.Context(t)
	r, lr := flowRouter(t, time.Minute)
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1]) // FULL_DUPLEX_STREAMED: no message timer while waiting

	a, _ := routed(t, ctx, c, tokenBody(200, 0)) // idle pool: goes at once
	if err := lr.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	type result struct {
		s   *extprocclient.Stream
		err error
	}
	bDone := make(chan result, 1)
	b := open(t, ctx, c, tokenBody(200, 5000), extprocclient.HeaderField{Key: "x-tenant", Value: "b"})
	go func() {
		for {
			f, err := b.ReadUpstream(ctx)
			if errors.Is(err, io.EOF) || err == nil && f.Kind == extprocclient.FrameHeaders {
				bDone <- result{b, nil}
				return
			}
			if err != nil {
				bDone <- result{nil, err}
				return
			}
		}
	}()
	waitWaiting(t, r, 1)

	cctx, leave := context.WithCancel(ctx)
	cs := open(t, cctx, c, tokenBody(200, 9000), extprocclient.HeaderField{Key: "x-tenant", Value: "c"})
	waitWaiting(t, r, 2)
	// The status page's view: both tenants wait in the default band.
	var shown []string
	for _, b := range status.RouterFlow(r) {
		shown = append(shown, b.Band+" "+strconv.Itoa(b.Requests)+" "+b.Flows)
	}
	if got, want := strings.Join(shown, "; "), "high 0 ; default 2 b: 1, c: 1"; got != want {
		t.Errorf("status page's flow control: got %q, want %q", got, want)
	}
	leave()
	cs.Close()
	waitWaiting(t, r, 1) // c left; b still waits

	select {
	case res := <-bDone:
		t.Fatalf("b routed while the pool was saturated: %v", res.err)
	default:
	}
	respond(t, ctx, a, "200", "application/json", `{"choices":[{"text":"ok"}]}`) // a's prefill done, then freed
	res := <-bDone
	if res.err != nil {
		t.Fatalf("b: %v", res.err)
	}
	waitWaiting(t, r, 0)
	respond(t, ctx, res.s, "200", "application/json", `{"choices":[{"text":"ok"}]}`)
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatalf("after every response: %v", err)
	}
}

// TestFlowControlDeadline: a request whose TTFT target passes while it
// waits is answered 429 with retry-after, reason queue_deadline.
func TestFlowControlDeadline(t *testing.T) {
	ctx := testenv.Context(t)
	r, lr := flowRouter(t, time.Minute)
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1])
	a, _ := routed(t, ctx, c, tokenBody(200, 0))
	s := open(t, ctx, c, tokenBody(200, 5000), extprocclient.HeaderField{Key: globalrouter.HeaderTTFT, Value: "30"})
	for {
		_, err := s.ReadUpstream(ctx)
		if errors.Is(err, extprocclient.ErrLocalReply) {
			break
		}
		if err != nil {
			t.Fatalf("waiting request: got %v, want a local reply", err)
		}
	}
	lr2 := s.Info().LocalReply
	_, retry := lr2.Headers.Get("retry-after")
	reason, _ := lr2.Headers.Get("x-kvgate-dropped-reason")
	if lr2.Status != 429 || !retry || reason != flowcontrol.ReasonDeadline {
		t.Errorf("got %d %v %s, want 429 with retry-after and reason %s", lr2.Status, lr2.Headers, lr2.Body, flowcontrol.ReasonDeadline)
	}
	respond(t, ctx, a, "200", "application/json", `{}`)
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if n := waiting(r); n != 0 {
		t.Errorf("%d requests still waiting", n)
	}
}

// TestFlowControlEngineSaturation: the pool's engines report saturation
// (the local router's saturation_waiting, the worker chain's saturation
// filter): a request waits although no prompt tokens are queued on the
// router, and goes once the engine's queue drains (the re-probe tick).
func TestFlowControlEngineSaturation(t *testing.T) {
	ctx := testenv.Context(t)
	lr := pooltest.StartConfigured(t, "pool-a", 16, func(c *localrouter.Config) { c.SaturationWaiting = 4 }, pooltest.Workers("a", 1)...)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{"m"}, lr.Addr))
	cfg.Probe.Timeout, cfg.Probe.MinTimeout = 10*time.Second, 10*time.Second
	cfg.FlowControl = flowcontrol.Config{Enabled: true, Deadline: time.Minute, Reprobe: 20 * time.Millisecond}
	r, err := globalrouter.New(cfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1])

	lr.Router.SetEngineSignals("a-0", map[uint32]signals.Sample{0: {Waiting: 9, At: time.Now()}})
	s := open(t, ctx, c, tokenBody(64, 0))
	waitWaiting(t, r, 1)
	lr.Router.SetEngineSignals("a-0", map[uint32]signals.Sample{0: {Waiting: 0, At: time.Now()}})
	for {
		f, err := s.ReadUpstream(ctx)
		if err != nil {
			t.Fatalf("waiting request: %v", err)
		}
		if f.Kind == extprocclient.FrameHeaders {
			break
		}
	}
	waitWaiting(t, r, 0)
	respond(t, ctx, s, "200", "application/json", `{}`)
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}
