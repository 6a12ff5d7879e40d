package extproc_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

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
		// Issue 27: the engine (Python's json) reads the last of a key
		// named twice; by default kvgate refuses the ambiguity.
		{"duplicate model", "/v1/completions", `{"model":"m1","model":"other","prompt":"hi"}`, nil, 400, "duplicate_key", "duplicate_key", ""},
		{"duplicate nested key", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a","content":"b"}]}`, nil, 400, "duplicate_key", "duplicate_key", ""},
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
