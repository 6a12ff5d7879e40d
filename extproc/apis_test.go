package extproc_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestAPIPathsRouted: by default the Responses API and Anthropic's
// Messages are inference paths, routed with their prompt read.
func TestAPIPathsRouted(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[1])
	for _, tc := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"m1","input":"hello there","tools":[{"type":"function","name":"f","parameters":{}}]}`},
		{"/v1/responses", `{"model":"m1","input":[{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"42"}]}`},
		{"/v1/messages", `{"model":"m1","max_tokens":8,"messages":[{"role":"user","content":"hello there"}]}`},
	} {
		res, err := c.Process(testenv.Context(t), extprocclient.Request{
			Message:  extprocclient.Message{Headers: post(tc.path), Body: [][]byte{[]byte(tc.body)}},
			Upstream: sseResponse("ok"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Info.LocalReply != nil {
			t.Fatalf("%s: local reply %d %s", tc.path, res.Info.LocalReply.Status, res.Info.LocalReply.Body)
		}
		if got := get(res.Upstream.Headers, "x-gateway-destination-endpoint"); got == "" {
			t.Errorf("%s: no destination header upstream", tc.path)
		}
	}
	reqs := d.requests()
	if len(reqs) != 3 {
		t.Fatalf("got %d decisions, want 3", len(reqs))
	}
	for _, r := range reqs {
		if r.Chat == nil || len(r.Chat.Messages) == 0 {
			t.Errorf("%s: decision without the chat read from the body", r.Path)
		}
	}
}

// TestAnthropicErrorShape: what the server answers itself on /v1/messages
// is in Anthropic's error shape (@anthropic-ai/sdk 1.16.0,
// resources/shared.d.ts ErrorResponse: type "error", error.type one of
// ErrorType, error.message), on /v1/responses in OpenAI's.
func TestAnthropicErrorShape(t *testing.T) {
	decideErr := func(err error) func(*globalrouter.Request) (*globalrouter.Decision, error) {
		return func(*globalrouter.Request) (*globalrouter.Decision, error) { return nil, err }
	}
	for _, tc := range []struct {
		name, path, body string
		decide           func(*globalrouter.Request) (*globalrouter.Decision, error)
		status           int
		typ              string
	}{
		{"bad json", "/v1/messages", `{"model":"m1","messages":[`, nil, 400, "invalid_request_error"},
		{"missing messages", "/v1/messages", `{"model":"m1","max_tokens":3}`, nil, 400, "invalid_request_error"},
		{"unknown model", "/v1/messages", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, decideErr(globalrouter.ErrUnknownModel), 404, "not_found_error"},
		{"saturated", "/v1/messages", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, decideErr(globalrouter.ErrSaturated), 429, "rate_limit_error"},
		{"forbidden", "/v1/messages", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, decideErr(globalrouter.ErrForbidden), 403, "permission_error"},
		{"no pool", "/v1/messages", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, decideErr(globalrouter.ErrNoPool), 503, "overloaded_error"},
		{"internal", "/v1/messages", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, decideErr(errors.New("boom")), 500, "api_error"},
		{"too large", "/v1/messages", `{"model":"m1","messages":[{"role":"user","content":"` + longText(2000) + `"}]}`, nil, 413, "invalid_request_error"},
		{"responses stays OpenAI", "/v1/responses", `{"model":"m1"}`, nil, 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, _ := startServer(t, extproc.Config{MaxBodyBytes: 1024}, &deciderDouble{decide: tc.decide})
			c := envoyClient(t, conn, allModes[1])
			res, err := c.Process(testenv.Context(t), extprocclient.Request{
				Message:  extprocclient.Message{Headers: post(tc.path), Body: [][]byte{[]byte(tc.body)}},
				Upstream: sseResponse("unexpected"),
			})
			if err != nil {
				t.Fatal(err)
			}
			lr := res.Info.LocalReply
			if lr == nil {
				t.Fatal("no local reply")
			}
			if lr.Status != tc.status {
				t.Errorf("status %d, want %d", lr.Status, tc.status)
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type, Message string
					Code          *string
				} `json:"error"`
			}
			if err := json.Unmarshal(lr.Body, &e); err != nil {
				t.Fatalf("body %q: %v", lr.Body, err)
			}
			if tc.typ == "" { // OpenAI's shape: error.code, no top-level type
				if e.Type != "" || e.Error.Code == nil || e.Error.Message == "" {
					t.Errorf("body %s, want OpenAI's error shape", lr.Body)
				}
				return
			}
			if e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message == "" || e.Error.Code != nil {
				t.Errorf("body %s, want type error, error.type %q and a message", lr.Body, tc.typ)
			}
		})
	}
}

func longText(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'x'
	}
	return string(b)
}
