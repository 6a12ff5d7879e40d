package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kvgate/kvgate/tokenizer"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

var sseChunks = []string{
	"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
	"data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\ndata: {\"choices\":[],\"usa",
	"ge\":{\"prompt_tokens\":12,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
}

func TestRoutesInEveryMode(t *testing.T) {
	all := append(allModes[:len(allModes):len(allModes)],
		modes{"req=FDS/resp=BUFFERED", extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED})
	for _, m := range all {
		t.Run(m.name, func(t *testing.T) {
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{}, d)
			c := envoyClient(t, conn, m)
			res, err := c.Process(testenv.Context(t), extprocclient.Request{
				Message: extprocclient.Message{
					Headers: post("/v1/chat/completions?x=1", extprocclient.HeaderField{Key: "x-request-id", Value: "req-1"}),
					Body:    [][]byte{[]byte(chatBody[:10]), []byte(chatBody[10:])},
				},
				Upstream: sseResponse(sseChunks...),
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Info.LocalReply != nil {
				t.Fatalf("local reply %d %s", res.Info.LocalReply.Status, res.Info.LocalReply.Body)
			}
			up := res.Upstream
			want := map[string]string{
				"x-gateway-destination-endpoint": wantDestination, // the same list as envoy.lb
				"x-kvgate-pool":                  "pool-a",
				"x-kvgate-worker-id":             "w1",
				"x-kvgate-dp-rank":               "2",
				"x-kvgate-overlap-blocks":        "7",
				"x-prefiller-host-port":          "",
				"x-kvgate-explain":               "",
			}
			got := map[string]string{}
			for k := range want {
				got[k] = get(up.Headers, k)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("upstream headers (-want +got):\n%s", diff)
			}
			if got, want := string(up.BodyBytes()), chatBody; got != want {
				t.Errorf("upstream body %q, want %q", got, want)
			}
			lb := res.Info.DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			if lb != wantDestination {
				t.Errorf("envoy.lb metadata %q, want %q", lb, wantDestination)
			}
			if !res.Info.RouteCacheCleared {
				t.Error("route cache not cleared")
			}
			if res.Info.SpuriousMessages != 0 || res.Info.RejectedMutations != 0 {
				t.Errorf("spurious %d, rejected mutations %d, want 0, 0", res.Info.SpuriousMessages, res.Info.RejectedMutations)
			}
			down := res.Downstream
			if got, want := string(down.BodyBytes()), strings.Join(sseChunks, ""); got != want {
				t.Errorf("downstream body %q, want %q", got, want)
			}
			if got := get(down.Headers, "x-kvgate-worker-id"); got != "w1" {
				t.Errorf("response x-kvgate-worker-id %q, want w1", got)
			}
			if got := get(down.Headers, "x-kvgate-endpoint"); got != "10.0.0.1:8000" {
				t.Errorf("response x-kvgate-endpoint %q, want 10.0.0.1:8000", got)
			}
			reqs := d.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d decisions, want 1", len(reqs))
			}
			// The lifecycle id is the server's own; the client's is kept
			// for logs.
			if !strings.HasPrefix(reqs[0].ID, "kvgate-") {
				t.Errorf("request id %q, want one the server made", reqs[0].ID)
			}
			wantReq := &globalrouter.Request{
				ClientID: "req-1", Path: "/v1/chat/completions", Model: "m1", BodyBytes: len(chatBody),
				Chat: tokenizer.NewChat(tokenizer.Message{Role: "system", Content: "Be brief."}, tokenizer.Message{Role: "user", Content: "héllo 世界, \"quoted\""}),
			}
			gotReq := *reqs[0]
			gotReq.Headers, gotReq.ID = nil, ""
			if diff := cmp.Diff(wantReq, &gotReq); diff != "" {
				t.Errorf("decider request (-want +got):\n%s", diff)
			}
			if got := reqs[0].Headers["content-type"]; got != "application/json" {
				t.Errorf("request headers content-type %q, want application/json", got)
			}
			testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
				got := d.lease(t, 0).calls()
				return fmt.Sprintf("lease calls %v, want [prefill free]", got), cmp.Equal(got, []string{"prefill", "free"})
			})
		})
	}
}

func TestPrefillerAndExplain(t *testing.T) {
	d := &deciderDouble{decide: func(req *globalrouter.Request) (*globalrouter.Decision, error) {
		dec := fixedDecision()
		dec.Prefill = &globalrouter.Endpoint{Pool: "prefill", Selection: routing.Selection{WorkerID: "p1", Address: "10.0.2.1:8000"}}
		if !req.Explain {
			dec.Explanation = ""
		}
		return dec, nil
	}}
	conn, _ := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
		Headers: post("/v1/completions", extprocclient.HeaderField{Key: "x-kvgate-explain", Value: "1"}),
		Body:    [][]byte{[]byte(`{"model":"m1","prompt":[1,2,3]}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := get(res.Upstream.Headers, "x-prefiller-host-port"), "10.0.2.1:8000"; got != want {
		t.Errorf("x-prefiller-host-port %q, want %q", got, want)
	}
	if got, want := get(res.Upstream.Headers, "x-kvgate-explain"), "pool-a: overlap 7 blocks; pool-b: overlap 0 blocks"; got != want {
		t.Errorf("x-kvgate-explain %q, want %q", got, want)
	}
	if got := d.requests()[0]; !got.Explain || !cmp.Equal(got.PromptTokens, []uint32{1, 2, 3}) {
		t.Errorf("request Explain %v tokens %v, want true [1 2 3]", got.Explain, got.PromptTokens)
	}
}

func TestClientPrefillerHeaderRemoved(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
		Headers: post("/v1/completions", extprocclient.HeaderField{Key: "x-prefiller-host-port", Value: "6.6.6.6:1"}),
		Body:    [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := res.Upstream.Headers.Get("x-prefiller-host-port"); ok {
		t.Errorf("x-prefiller-host-port %q reached upstream, want removed", v)
	}
}

// TestBodyReemittedUnchanged sends bodies in chunks of every awkward shape:
// over the 62,000-byte limit, split inside UTF-8 sequences and inside JSON
// strings; the upstream must see the same bytes, each chunk within the limit.
func TestBodyReemittedUnchanged(t *testing.T) {
	long := strings.Repeat("Ünïcödé prefix 世界 \\\"esc\\\" ", 9000) // ~250 KB
	big := []byte(`{"model":"m1","messages":[{"role":"user","content":"` + long + `"}]}`)
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{}, d)
			c := envoyClient(t, conn, m)
			for _, split := range [][]int{{len(big)}, {1, 70000, 3, 100000}, {62000, 62001}, {7, 7, 7}} {
				chunks := splitAt(big, split)
				ctx := testenv.Context(t)
				s := c.Open(ctx, nil)
				if err := s.SendRequestHeaders(ctx, post("/v1/chat/completions"), false); err != nil {
					t.Fatal(err)
				}
				for i, ch := range chunks {
					if err := s.SendRequestData(ctx, ch, i == len(chunks)-1); err != nil {
						t.Fatal(err)
					}
				}
				var got []byte
				for {
					f, err := s.ReadUpstream(ctx)
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if f.Kind == extprocclient.FrameData {
						if m.req == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED && len(f.Data) > extproc.MaxChunkBytes {
							t.Errorf("re-emitted chunk of %d bytes, want ≤ %d", len(f.Data), extproc.MaxChunkBytes)
						}
						got = append(got, f.Data...)
					}
				}
				s.Close()
				if !bytes.Equal(got, big) {
					t.Fatalf("split %v: upstream body differs (%d bytes, want %d)", split, len(got), len(big))
				}
			}
			for _, r := range d.requests() {
				if chatMessages(r)[0].Content != strings.ReplaceAll(long, `\"`, `"`) {
					t.Fatal("decider saw a different prompt")
				}
			}
		})
	}
}

// splitAt cuts b into chunks of the given sizes (the last takes the rest).
func splitAt(b []byte, sizes []int) [][]byte {
	var out [][]byte
	for _, n := range sizes {
		if len(b) == 0 {
			break
		}
		n = min(n, len(b))
		out = append(out, b[:n])
		b = b[n:]
	}
	if len(b) > 0 {
		out = append(out, b)
	}
	return out
}

// TestEverySplitPoint splits a small body with multi-byte characters and
// escapes in two at every byte, in FDS (where Envoy forwards each chunk).
func TestEverySplitPoint(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	body := []byte(chatBody)
	for i := 1; i < len(body); i++ {
		res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
			Headers: post("/v1/chat/completions"),
			Body:    [][]byte{body[:i], body[i:]},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Info.LocalReply != nil {
			t.Fatalf("split at %d: local reply %d %s (%s)", i, res.Info.LocalReply.Status, res.Info.LocalReply.Body, res.Info.LocalReply.Details)
		}
		if got := string(res.Upstream.BodyBytes()); got != chatBody {
			t.Fatalf("split at %d: upstream body %q", i, got)
		}
	}
	for i, r := range d.requests() {
		if got, want := chatMessages(r)[1].Content, "héllo 世界, \"quoted\""; got != want {
			t.Fatalf("split at %d: content %q, want %q", i+1, got, want)
		}
	}
}

func TestRequestTrailers(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{}, d)
			c := envoyClient(t, conn, m)
			res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
				Headers:  post("/v1/completions"),
				Body:     [][]byte{[]byte(`{"model":"m1",`), []byte(`"prompt":"hi"}`)},
				Trailers: extprocclient.Headers{{Key: "x-checksum", Value: "1"}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Info.LocalReply != nil {
				t.Fatalf("local reply %d %s", res.Info.LocalReply.Status, res.Info.LocalReply.Body)
			}
			if got := get(res.Upstream.Headers, "x-kvgate-pool"); got != "pool-a" {
				t.Errorf("x-kvgate-pool %q, want pool-a", got)
			}
			if got := string(res.Upstream.BodyBytes()); got != `{"model":"m1","prompt":"hi"}` {
				t.Errorf("upstream body %q", got)
			}
			if got := get(res.Upstream.Trailers, "x-checksum"); got != "1" {
				t.Errorf("upstream trailer x-checksum %q, want 1", got)
			}
		})
	}
}

func TestPassThrough(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{InferencePaths: []string{"/v1/chat/completions", "/v2/generate"}}, d)
			c := envoyClient(t, conn, m)
			for _, tc := range []struct {
				name string
				req  extprocclient.Message
			}{
				{"GET models", extprocclient.Message{Headers: extprocclient.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}}},
				{"POST other path", extprocclient.Message{Headers: post("/admin/reload"), Body: [][]byte{[]byte("not json at all"), []byte("é")[:1]}}},
				{"path not configured", extprocclient.Message{Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)}}},
				{"GET inference path", extprocclient.Message{Headers: extprocclient.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/chat/completions"}}}},
				// A client must not pick Envoy's upstream: the ORIGINAL_DST
				// cluster reads this header unsanitised.
				{"client-supplied destination", extprocclient.Message{Headers: extprocclient.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"},
					{Key: "x-gateway-destination-endpoint", Value: "169.254.169.254:80"}, {Key: "x-prefiller-host-port", Value: "127.0.0.1:9901"}}}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					res, err := c.Process(testenv.Context(t), extprocclient.Request{
						Message:  tc.req,
						Upstream: sseResponse("plain ", "response"),
					})
					if err != nil {
						t.Fatal(err)
					}
					if res.Info.LocalReply != nil {
						t.Fatalf("local reply %d", res.Info.LocalReply.Status)
					}
					if diff := cmp.Diff(tc.req.BodyBytes(), res.Upstream.BodyBytes()); diff != "" {
						t.Errorf("upstream body (-want +got):\n%s", diff)
					}
					for _, h := range []string{"x-gateway-destination-endpoint", "x-kvgate-pool", "x-prefiller-host-port"} {
						if v, ok := res.Upstream.Headers.Get(h); ok {
							t.Errorf("%s = %q on a pass-through request", h, v)
						}
					}
					if got := string(res.Downstream.BodyBytes()); got != "plain response" {
						t.Errorf("downstream body %q", got)
					}
				})
			}
			if n := len(d.requests()); n != 0 {
				t.Errorf("%d decisions for pass-through requests, want 0", n)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	decideErr := func(err error) func(*globalrouter.Request) (*globalrouter.Decision, error) {
		return func(*globalrouter.Request) (*globalrouter.Decision, error) { return nil, err }
	}
	for _, tc := range []struct {
		name       string
		path       string
		body       string
		decide     func(*globalrouter.Request) (*globalrouter.Decision, error)
		status     int
		reason     string
		code       string
		retryAfter string
	}{
		{"bad json", "/v1/chat/completions", `{"model":"m1","messages":[`, nil, 400, "bad_json", "bad_json", ""},
		{"trailing garbage", "/v1/completions", `{"model":"m1","prompt":"a"} x`, nil, 400, "bad_json", "bad_json", ""},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil, 400, "missing_field", "missing_field", ""},
		{"missing messages", "/v1/chat/completions", `{"model":"m1","prompt":"hi"}`, nil, 400, "missing_field", "missing_field", ""},
		{"missing prompt", "/v1/completions", `{"model":"m1"}`, nil, 400, "missing_field", "missing_field", ""},
		{"empty messages", "/v1/chat/completions", `{"model":"m1","messages":[]}`, nil, 400, "bad_field", "bad_field", ""},
		{"batch prompt", "/v1/completions", `{"model":"m1","prompt":["a","b"]}`, nil, 400, "bad_field", "bad_field", ""},
		{"negative token", "/v1/completions", `{"model":"m1","prompt":[1,-2]}`, nil, 400, "bad_field", "bad_field", ""},
		{"empty body", "/v1/completions", ``, nil, 400, "bad_json", "bad_json", ""},
		{"too large", "/v1/completions", `{"model":"m1","prompt":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, "body_too_large", "request_too_large", ""},
		{"decider bad request", "/v1/completions", `{"model":"m1","prompt":"hi"}`, decideErr(fmt.Errorf("wrap: %w", globalrouter.ErrBadRequest)), 400, "bad_request", "bad_request", ""},
		{"unknown model", "/v1/completions", `{"model":"nope","prompt":"hi"}`, decideErr(fmt.Errorf("model nope: %w", globalrouter.ErrUnknownModel)), 404, "unknown_model", "model_not_found", ""},
		{"saturated", "/v1/completions", `{"model":"m1","prompt":"hi"}`, decideErr(globalrouter.ErrSaturated), 429, "saturated", "rate_limit_exceeded", "1"},
		{"no pool", "/v1/completions", `{"model":"m1","prompt":"hi"}`, decideErr(globalrouter.ErrNoPool), 503, "no_pool_reachable", "no_pool_available", "1"},
		{"no pool, retry when the circuit closes", "/v1/completions", `{"model":"m1","prompt":"hi"}`,
			decideErr(&globalrouter.Refusal{Kind: globalrouter.ErrNoPool, Reason: "no_pool_reachable", Public: "pool-a is unreachable", RetryAfter: 2500 * time.Millisecond,
				Err: errors.New("probe 10.1.2.3:7100: connection refused")}), 503, "no_pool_reachable", "no_pool_available", "3"},
		{"forbidden", "/v1/completions", `{"model":"m1","prompt":"hi"}`,
			decideErr(&globalrouter.Refusal{Kind: globalrouter.ErrForbidden, Reason: "policy_refused", Public: "x-kvgate-pool: \"b\" is not allowed"}), 403, "policy_refused", "forbidden", ""},
		{"no endpoint in the subset", "/v1/completions", `{"model":"m1","prompt":"hi"}`, decideErr(fmt.Errorf("pool a: %w", globalrouter.ErrNoEndpointInSubset)), 503, "no_endpoint_in_subset", "no_endpoint_in_subset", "1"},
		{"pin refused", "/v1/completions", `{"model":"m1","prompt":"hi"}`, decideErr(fmt.Errorf("pool pool-z: %w", globalrouter.ErrPinRefused)), 400, "pin_refused", "pin_refused", ""},
		{"pin refused wins over saturated", "/v1/completions", `{"model":"m1","prompt":"hi"}`, decideErr(errors.Join(globalrouter.ErrSaturated, globalrouter.ErrPinRefused)), 400, "pin_refused", "pin_refused", ""},
		{"internal", "/v1/completions", `{"model":"m1","prompt":"hi"}`, decideErr(errors.New("boom")), 500, "internal_error", "internal_error", ""},
	} {
		for _, m := range allModes[1:3] { // one FDS and one BUFFERED request mode
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				d := &deciderDouble{decide: tc.decide}
				conn, reg := startServer(t, extproc.Config{MaxBodyBytes: 1024}, d)
				c := envoyClient(t, conn, m)
				var chunks [][]byte
				for b := []byte(tc.body); len(b) > 0; b = b[min(len(b), 300):] {
					chunks = append(chunks, b[:min(len(b), 300)])
				}
				if len(chunks) == 0 {
					chunks = [][]byte{{}}
				}
				res, err := c.Process(testenv.Context(t), extprocclient.Request{
					Message:  extprocclient.Message{Headers: post(tc.path), Body: chunks},
					Upstream: sseResponse("unexpected"),
				})
				if err != nil {
					t.Fatal(err)
				}
				lr := res.Info.LocalReply
				if lr == nil {
					t.Fatalf("no local reply, upstream got %v", res.Upstream)
				}
				if lr.Status != tc.status {
					t.Errorf("status %d, want %d", lr.Status, tc.status)
				}
				if got := get(lr.Headers, "x-kvgate-dropped-reason"); got != tc.reason {
					t.Errorf("x-kvgate-dropped-reason %q, want %q", got, tc.reason)
				}
				if got := get(lr.Headers, "retry-after"); got != tc.retryAfter {
					t.Errorf("retry-after %q, want %q", got, tc.retryAfter)
				}
				if got := get(lr.Headers, "content-type"); got != "application/json" {
					t.Errorf("content-type %q, want application/json", got)
				}
				var e struct {
					Error struct{ Message, Type, Code string }
				}
				if err := json.Unmarshal(lr.Body, &e); err != nil {
					t.Fatalf("body %q: %v", lr.Body, err)
				}
				if e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
					t.Errorf("error body %+v, want code %q and a message and type", e.Error, tc.code)
				}
				if strings.Contains(string(lr.Body), "10.1.2.3") {
					t.Errorf("error body %s names an internal address", lr.Body)
				}
				if got := counterValue(t, reg, "kvgate_extproc_requests_total", fmt.Sprint(tc.status)); got != 1 {
					t.Errorf("requests_total{code=%d} = %v, want 1", tc.status, got)
				}
			})
		}
	}
}

func TestBodylessPostRefused(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	c := envoyClient(t, conn, allModes[0])
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{Headers: post("/v1/completions")}})
	if err != nil {
		t.Fatal(err)
	}
	if lr := res.Info.LocalReply; lr == nil || lr.Status != 400 {
		t.Fatalf("local reply %+v, want 400", lr)
	}
}

// TestLifecycle drives the response by hand and checks each lease call
// happens at its moment: prefill complete once the first chunk is through,
// free at the end, on an error status, or when the stream ends early.
func TestLifecycle(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			for _, tc := range []struct {
				name      string
				status    string
				end       string // "eos", "trailers", "cancel", "empty-eos"
				wantFirst []string
				wantEnd   []string
			}{
				{"end of stream", "200", "eos", []string{"prefill"}, []string{"prefill", "free"}},
				{"trailers", "200", "trailers", []string{"prefill"}, []string{"prefill", "free"}},
				{"client gone", "200", "cancel", []string{"prefill"}, []string{"prefill", "free"}},
				{"error status", "503", "eos", []string{"free"}, []string{"free"}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					if tc.end == "trailers" && m.resp != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
						t.Skip("response trailers are only sent with trailer mode SEND, set here for FDS")
					}
					d := &deciderDouble{}
					conn, reg := startServer(t, extproc.Config{}, d)
					c := envoyClient(t, conn, m)
					ctx := testenv.Context(t)
					s := c.Open(ctx, nil)
					defer s.Close()
					mustOK(t, s.SendRequestHeaders(ctx, post("/v1/completions"), false))
					mustOK(t, s.SendRequestData(ctx, []byte(`{"model":"m1","prompt":"hi","stream":true}`), true))
					drain(t, ctx, s.ReadUpstream)
					lease := d.lease(t, 0)
					if got := lease.calls(); len(got) != 0 {
						t.Fatalf("lease calls before the response %v, want none", got)
					}
					mustOK(t, s.SendResponseHeaders(ctx, extprocclient.Headers{{Key: ":status", Value: tc.status}, {Key: "content-type", Value: "text/event-stream"}}, false))
					mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[0]), false))
					readUntilData(t, ctx, s)
					// The chunk is passed on before the router is told, so
					// the call may land just after the client has the chunk.
					testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
						if diff := cmp.Diff(tc.wantFirst, lease.calls()); diff != "" {
							return testenv.Errorf("lease calls after the first chunk (-want +got):\n%s", diff)
						}
						return "", true
					})
					mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[1]), false))
					switch tc.end {
					case "eos":
						mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[2]), true))
						drain(t, ctx, s.ReadDownstream)
					case "trailers":
						mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[2]), false))
						mustOK(t, s.SendResponseTrailers(ctx, extprocclient.Headers{{Key: "grpc-status", Value: "0"}}))
						drain(t, ctx, s.ReadDownstream)
					case "cancel":
						s.Close()
					}
					testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
						got := lease.calls()
						return fmt.Sprintf("lease calls %v, want %v", got, tc.wantEnd), cmp.Equal(got, tc.wantEnd)
					})
					s.Close()
					wantCode := tc.status
					if tc.end == "cancel" {
						// The response headers went through: the status is known.
						wantCode = "200"
					}
					testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
						got := counterValue(t, reg, "kvgate_extproc_requests_total", wantCode)
						return fmt.Sprintf("requests_total{code=%s} = %v, want 1", wantCode, got), got == 1
					})
					if tc.end == "eos" && tc.status == "200" {
						for kind, want := range map[string]float64{"prompt": 12, "completion": 2} {
							if got := counterValue(t, reg, "kvgate_extproc_tokens_total", kind); got != want {
								t.Errorf("tokens_total{kind=%s} = %v, want %v", kind, got, want)
							}
						}
					}
				})
			}
		})
	}
}

// TestFreedWhenStreamEndsBeforeResponse: Envoy gives up after the decision
// (client gone, upstream never answered): the request is freed and counted
// as 499.
func TestFreedWhenStreamEndsBeforeResponse(t *testing.T) {
	d := &deciderDouble{}
	conn, reg := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	ctx := testenv.Context(t)
	s := c.Open(ctx, nil)
	mustOK(t, s.SendRequestHeaders(ctx, post("/v1/completions"), false))
	mustOK(t, s.SendRequestData(ctx, []byte(`{"model":"m1","prompt":"hi"}`), true))
	drain(t, ctx, s.ReadUpstream)
	s.Close()
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := d.lease(t, 0).calls()
		return fmt.Sprintf("lease calls %v, want [free]", got), cmp.Equal(got, []string{"free"})
	})
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := counterValue(t, reg, "kvgate_extproc_requests_total", "499")
		return fmt.Sprintf("requests_total{code=499} = %v, want 1", got), got == 1
	})
}

func TestHealth(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	for _, svc := range []string{"", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := healthpb.NewHealthClient(conn).Check(testenv.Context(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v, want SERVING", svc, r.Status)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []extproc.Config{
		{InferencePaths: []string{"v1/completions"}},
		{InferencePaths: []string{"/v1/completions?x"}},
		{MaxBodyBytes: -1},
		{RequestBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
		{ResponseBodyMode: extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL},
	} {
		if _, err := extproc.New(cfg, &deciderDouble{}, nil, nil); err == nil {
			t.Errorf("New(%+v) accepted, want an error", cfg)
		}
	}
	if _, err := extproc.New(extproc.Config{}, nil, nil, nil); err == nil {
		t.Error("New with a nil decider accepted")
	}
}

func TestUnsupportedRequestMode(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	c := envoyClient(t, conn, modes{"STREAMED", extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_STREAMED})
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
		Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if lr := res.Info.LocalReply; lr == nil || lr.Status != 500 || get(lr.Headers, "x-kvgate-dropped-reason") != "unsupported_processing_mode" {
		t.Fatalf("local reply %+v, want 500 unsupported_processing_mode", lr)
	}
}

const testCtxTimeout = 20 * time.Second

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func drain(t *testing.T, ctx context.Context, read func(context.Context) (extprocclient.Frame, error)) {
	t.Helper()
	for {
		_, err := read(ctx)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readUntilData reads downstream frames up to the first data frame.
func readUntilData(t *testing.T, ctx context.Context, s *extprocclient.Stream) {
	t.Helper()
	for {
		f, err := s.ReadDownstream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == extprocclient.FrameData {
			return
		}
	}
}

// TestDestinationHeader: the endpoint-picker protocol forbids different
// values in the header and the envoy.lb metadata: both carry the ordered
// list (primary, then fallbacks). HeaderFallbacks is a no-op kept for old
// configurations.
func TestDestinationHeader(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        extproc.Config
		wantHeader string
	}{
		{"default: the list", extproc.Config{}, wantDestination},
		{"HeaderFallbacks (no-op): the list", extproc.Config{HeaderFallbacks: true}, wantDestination},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, _ := startServer(t, tc.cfg, &deciderDouble{})
			for _, m := range allModes {
				c := envoyClient(t, conn, m)
				res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
					Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
				}})
				if err != nil {
					t.Fatal(err)
				}
				if got := get(res.Upstream.Headers, "x-gateway-destination-endpoint"); got != tc.wantHeader {
					t.Errorf("%s: header %q, want %q", m.name, got, tc.wantHeader)
				}
				if got := res.Info.DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue(); got != wantDestination {
					t.Errorf("%s: envoy.lb metadata %q, want %q", m.name, got, wantDestination)
				}
			}
		})
	}
}

// TestLargeBufferedBody: a BUFFERED body arrives as one gRPC message,
// larger than gRPC's 4 MiB default; up to the cap it routes, past it 413.
func TestLargeBufferedBody(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{MaxBodyBytes: 8 << 20}, d)
	c := envoyClient(t, conn, allModes[2])
	for _, tc := range []struct {
		size   int
		status int
	}{{6 << 20, 0}, {8<<20 + 100, 413}} {
		body := []byte(`{"model":"m1","prompt":"` + strings.Repeat("x", tc.size) + `"}`)
		res, err := c.Process(testenv.Context(t), extprocclient.Request{
			Message:  extprocclient.Message{Headers: post("/v1/completions"), Body: [][]byte{body}},
			Upstream: sseResponse("ok"),
		})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		if lr := res.Info.LocalReply; lr != nil {
			got = lr.Status
		}
		if got != tc.status {
			t.Errorf("%d-byte body: local reply %d, want %d (0: routed)", len(body), got, tc.status)
		}
	}
}

func TestReflection(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"envoy.service.ext_proc.v3.ExternalProcessor", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, want %s among them", names, want)
		}
	}
}

// chatMessages is r's conversation (nil for a completion).
func chatMessages(r *globalrouter.Request) []tokenizer.Message {
	if r.Chat == nil {
		return nil
	}
	return r.Chat.Messages
}
