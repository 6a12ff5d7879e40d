package extproc_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/envoy/gateway"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// realRouter is the real global router over one real local router of
// three workers (pooltest), model "m", with cfg's trust and tenancy.
func realRouter(t *testing.T, mutate func(*globalrouter.Config)) (*globalrouter.Router, *pooltest.Server) {
	t.Helper()
	lr := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 3)...)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{"m"}, lr.Addr))
	// Behaviour, not speed, on a shared machine: without the floor the
	// adaptive deadline (4 × p99, from 25 ms) fires under a starved -race
	// run and the decision goes best-effort, unaccounted.
	cfg.Probe.Timeout, cfg.Probe.MinTimeout = 10*time.Second, 10*time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := globalrouter.New(cfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, lr
}

// tokenBody is a completion whose prompt is n token ids from base.
func tokenBody(n, base int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(base + i)
	}
	return `{"model":"m","prompt":[` + strings.Join(ids, ",") + `]}`
}

func tokenIDs(n, base int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// routed opens a stream and runs the request until Envoy would connect to
// the worker; the caller ends the stream (or sends the response).
func routed(t *testing.T, ctx context.Context, c *extprocclient.Client, body string, extra ...extprocclient.HeaderField) (*extprocclient.Stream, extprocclient.Headers) {
	t.Helper()
	s := c.Open(ctx, nil)
	if err := s.SendRequestHeaders(ctx, post("/v1/completions", extra...), false); err != nil {
		t.Fatal(err)
	}
	if err := s.SendRequestData(ctx, []byte(body), true); err != nil {
		t.Fatal(err)
	}
	var up extprocclient.Headers
	for {
		f, err := s.ReadUpstream(ctx)
		if errors.Is(err, io.EOF) {
			return s, up
		}
		if errors.Is(err, extprocclient.ErrLocalReply) {
			lr := s.Info().LocalReply
			t.Fatalf("local reply %d %s", lr.Status, lr.Body)
		}
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == extprocclient.FrameHeaders {
			up = f.Headers
		}
	}
}

// TestSharedClientIDCountsEachRequest is issue 13's case: 30 concurrent
// requests sharing one x-request-id are 30 requests in flight on the
// local router, and all are freed after.
func TestSharedClientIDCountsEachRequest(t *testing.T) {
	ctx := testenv.Context(t)
	r, lr := realRouter(t, nil)
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1])
	const n = 30
	streams := make([]*extprocclient.Stream, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			streams[i], _ = routed(t, ctx, c, tokenBody(64, 1000*i), extprocclient.HeaderField{Key: "x-request-id", Value: "same-id"})
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if err := lr.WaitActive(ctx, n); err != nil {
		t.Fatalf("requests sharing one x-request-id: %v", err)
	}
	for _, s := range streams {
		s.Close() // the client goes: each request is freed
	}
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatalf("after the streams ended: %v", err)
	}
}

// TestRoutingHeadersForTrustedCallersOnly: by default the response carries
// no routing header (pool, worker, overlap, endpoint, explanation), so a
// guess at another tenant's cached prompt reads the same right or wrong;
// a trusted caller gets them, and its token never goes upstream.
func TestRoutingHeadersForTrustedCallersOnly(t *testing.T) {
	ctx := testenv.Context(t)
	sum := sha256.Sum256([]byte("s3cret"))
	r, lr := realRouter(t, func(c *globalrouter.Config) {
		c.Trust = globalrouter.TrustConfig{TokensSHA256: []string{hex.EncodeToString(sum[:])}, RoutingHeaders: globalrouter.AccessTrusted}
	})
	lr.Store(t, "a-1", tokenIDs(64, 7))
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1])
	reply := func(body string, extra ...extprocclient.HeaderField) (*extprocclient.Result, string) {
		res, err := c.Process(ctx, extprocclient.Request{
			Message:  extprocclient.Message{Headers: post("/v1/completions", append(extra, extprocclient.HeaderField{Key: "x-kvgate-explain", Value: "1"})...), Body: [][]byte{[]byte(body)}},
			Upstream: sseResponse("data: [DONE]\n\n"),
		})
		if err != nil {
			t.Fatal(err)
		}
		var routing []string
		for _, h := range res.Downstream.Headers {
			if strings.HasPrefix(h.Key, "x-kvgate-") || h.Key == "x-prefiller-host-port" {
				routing = append(routing, h.Key+"="+h.Value)
			}
		}
		return res, strings.Join(routing, " ")
	}
	_, right := reply(tokenBody(64, 7))
	_, wrong := reply(tokenBody(64, 8))
	if right != "" || wrong != "" {
		t.Errorf("untrusted caller got routing headers: right guess %q, wrong guess %q; want none", right, wrong)
	}
	res, got := reply(tokenBody(64, 7), extprocclient.HeaderField{Key: globalrouter.DefaultTrustHeader, Value: "s3cret"})
	if !strings.Contains(got, "x-kvgate-overlap-blocks=4") || !strings.Contains(got, "x-kvgate-explain=") {
		t.Errorf("trusted caller: routing headers %q, want the overlap and the explanation", got)
	}
	if _, ok := res.Upstream.Headers.Get(globalrouter.DefaultTrustHeader); ok {
		t.Error("the trust token went upstream")
	}
}

// TestConnectFailuresEjectTheWorker: when another endpoint of the list
// served (the gateway's report in envoy.lb metadata) or Envoy answered
// "upstream connect error", the primary is out of the candidates for the
// next requests, long before its lease would expire.
func TestConnectFailuresEjectTheWorker(t *testing.T) {
	ctx := testenv.Context(t)
	r, lr := realRouter(t, func(c *globalrouter.Config) {
		c.Trust.Steering, c.Trust.RoutingHeaders = globalrouter.AccessOn, globalrouter.AccessOn
	})
	prompt := tokenIDs(64, 7)
	for _, w := range []string{"a-0", "a-1", "a-2"} {
		lr.Store(t, w, prompt) // any worker would do
	}
	conn, _ := startServer(t, extproc.Config{}, r)
	c, err := extprocclient.New(conn, extprocclient.Config{
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
		ForwardingNamespaces: []string{"envoy.lb"}, ReceivingNamespaces: []string{"envoy.lb"},
		MessageTimeout: 5 * time.Second, BufferLimit: 32 << 20,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	primary := func() string {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: "m", PromptTokens: prompt})
		if err != nil {
			t.Fatal(err)
		}
		_ = d.Lease.Free(ctx)
		return d.Primary.Address
	}
	// The pool learns its other workers (same-pool fallbacks) in the
	// background.
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: "m", PromptTokens: prompt})
		if err != nil {
			return err.Error(), false
		}
		_ = d.Lease.Free(ctx)
		return "no same-pool fallback yet", len(d.Fallbacks) > 0
	})

	for _, tc := range []struct {
		name    string
		respond func(s *extprocclient.Stream, up extprocclient.Headers)
	}{
		{"a fallback served", func(s *extprocclient.Stream, up extprocclient.Headers) {
			md := s.Info().DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			list := strings.Split(md, ",")
			if len(list) < 2 {
				t.Fatalf("destination list %q has no fallback", md)
			}
			s.SetDynamicMetadata("envoy.lb", &structpb.Struct{Fields: map[string]*structpb.Value{
				"x-gateway-destination-endpoint-served": structpb.NewStringValue(list[1]),
			}})
			respond(t, ctx, s, "200", "application/json", `{"choices":[]}`)
		}},
		{"Envoy's upstream connect error", func(s *extprocclient.Stream, up extprocclient.Headers) {
			respond(t, ctx, s, "503", "text/plain", "upstream connect error or disconnect/reset before headers. reset reason: connection failure")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, up := routed(t, ctx, c, tokenBody(64, 7))
			dead, _ := up.Get("x-gateway-destination-endpoint")
			tc.respond(s, up)
			s.Close()
			for i := range 5 {
				if got := primary(); got == dead {
					t.Fatalf("decision %d after the connection failure went to %s again", i, dead)
				}
			}
		})
	}
	if err := lr.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}

func respond(t *testing.T, ctx context.Context, s *extprocclient.Stream, status, ctype, body string) {
	t.Helper()
	if err := s.SendResponseHeaders(ctx, extprocclient.Headers{{Key: ":status", Value: status}, {Key: "content-type", Value: ctype}}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.SendResponseData(ctx, []byte(body), true); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := s.ReadDownstream(ctx); err != nil {
			return
		}
	}
}

// TestWorkerRefusingConnections runs the bundled gateway (Envoy's part)
// in front of the ext_proc server and the real routers, with a worker
// that refuses connections and caches the prompt (so the router prefers
// it): the first request is served by a fallback of the same pool, and
// the report of that ejects the dead worker: the next requests go
// straight to live workers.
func TestWorkerRefusingConnections(t *testing.T) {
	ctx := testenv.Context(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close() // connections to it are refused from now on
	ok := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":64,"completion_tokens":1}}`)
	}
	live1, live2 := httptest.NewServer(http.HandlerFunc(ok)), httptest.NewServer(http.HandlerFunc(ok))
	defer live1.Close()
	defer live2.Close()
	lr := pooltest.Start(t, "pool-a", 16,
		pooltest.Worker{ID: "w-dead", Address: dead},
		pooltest.Worker{ID: "w-1", Address: live1.Listener.Addr().String()},
		pooltest.Worker{ID: "w-2", Address: live2.Listener.Addr().String()})
	prompt := tokenIDs(64, 7)
	lr.Store(t, "w-dead", prompt)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{"m"}, lr.Addr))
	// A fixed, generous probe deadline (the adaptive one, as short as
	// 25 ms, let a loaded machine's probe time out and the decision go best
	// effort), and an ejection that outlasts the test (the default 1 s
	// could end between two requests on a loaded machine, and the router
	// would rightly try the dead worker again): what is checked is that
	// the failure report ejects it, not for how long.
	cfg.Probe.Timeout, cfg.Probe.MinTimeout = 10*time.Second, 10*time.Second
	cfg.Probe.EjectBase, cfg.Probe.EjectMax = 10*time.Minute, 10*time.Minute
	cfg.Trust.RoutingHeaders = globalrouter.AccessOn
	r, err := globalrouter.New(cfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The pool learns its other workers (same-pool fallbacks) in the
	// background.
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: "m", PromptTokens: prompt})
		if err != nil {
			return err.Error(), false
		}
		_ = d.Lease.Free(ctx)
		return "no same-pool fallback yet", d.Primary.Address == dead && len(d.Fallbacks) > 0
	})

	conn, _ := startServer(t, extproc.Config{}, r)
	gcfg, err := gateway.DefaultConfig()
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(conn, gcfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	front := httptest.NewServer(gw)
	defer front.Close()
	client := front.Client()
	defer client.CloseIdleConnections()
	for i := range 4 {
		req, _ := http.NewRequestWithContext(ctx, "POST", front.URL+"/v1/completions", strings.NewReader(tokenBody(64, 7)))
		req.Header.Set("content-type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d %s", i, resp.StatusCode, body)
		}
		// The response names the endpoint that served: never the dead one.
		if ep := resp.Header.Get("x-kvgate-endpoint"); ep == dead || ep == "" {
			t.Errorf("request %d: served by %q", i, ep)
		}
		// After the first request's connection failure, the router no
		// longer chooses the dead worker.
		d, err := r.Decide(ctx, &globalrouter.Request{Model: "m", PromptTokens: prompt})
		if err != nil {
			t.Fatal(err)
		}
		_ = d.Lease.Free(ctx)
		if d.Primary.Address == dead {
			t.Errorf("after request %d: the router still chooses the dead worker", i)
		}
	}
	if err := lr.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}
