package mocker

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/tokenizer"
)

// namedEvents reads an SSE body of named events (event: / data:) into
// (name, payload) pairs, checking each payload's type is its event name.
func namedEvents(t *testing.T, r io.Reader) (names []string, data []map[string]any) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
				t.Fatalf("event %s: %v", name, err)
			}
			if m["type"] != name {
				t.Errorf("event %s carries type %v", name, m["type"])
			}
			names, data = append(names, name), append(data, m)
		}
	}
	return names, data
}

func decode(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestResponsesAPI: /v1/responses in the openai SDK's shapes (openai
// 7.60.0, resources/responses/responses.d.ts), text and function calls,
// streamed and not.
func TestResponsesAPI(t *testing.T) {
	_, hs, _ := startServer(t, ServerConfig{Model: "m"})
	ctx := testenv.Context(t)
	url := hs.URL + "/v1/responses"
	tools := `"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`

	r := decode(t, post(ctx, t, url, `{"model":"m","input":"hello there","max_output_tokens":3}`, nil))
	if r["object"] != "response" || r["status"] != "incomplete" || r["incomplete_details"].(map[string]any)["reason"] != "max_output_tokens" {
		t.Errorf("text response %v", r)
	}
	out := r["output"].([]any)[0].(map[string]any)
	part := out["content"].([]any)[0].(map[string]any)
	if out["type"] != "message" || out["role"] != "assistant" || part["type"] != "output_text" || len(strings.Fields(part["text"].(string))) != 3 {
		t.Errorf("output %v", out)
	}
	if u := r["usage"].(map[string]any); u["output_tokens"] != 3.0 || u["input_tokens"].(float64) < 1 {
		t.Errorf("usage %v", u)
	}

	r = decode(t, post(ctx, t, url, `{"model":"m","input":"weather in Paris?","max_output_tokens":2,`+tools+`}`, nil))
	call := r["output"].([]any)[0].(map[string]any)
	var args map[string]string
	if err := json.Unmarshal([]byte(call["arguments"].(string)), &args); err != nil || call["type"] != "function_call" || call["name"] != "get_weather" || args["city"] == "" || r["status"] != "completed" {
		t.Errorf("function call %v (arguments: %v)", call, err)
	}
	// The call answered: text.
	r = decode(t, post(ctx, t, url, `{"model":"m","max_output_tokens":2,`+tools+`,"input":[{"role":"user","content":"weather?"},`+
		`{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"c1","output":"sunny"}]}`, nil))
	if typ := r["output"].([]any)[0].(map[string]any)["type"]; typ != "message" {
		t.Errorf("after function_call_output: output type %v, want message", typ)
	}

	resp := post(ctx, t, url, `{"model":"m","input":"hello","max_output_tokens":2,"stream":true}`, nil)
	names, ev := namedEvents(t, resp.Body)
	resp.Body.Close()
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.done", "response.content_part.done",
		"response.output_item.done", "response.incomplete"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("text events (-want +got):\n%s", diff)
	}
	for i, e := range ev {
		if e["sequence_number"] != float64(i) {
			t.Errorf("event %d sequence_number %v", i, e["sequence_number"])
		}
	}

	resp = post(ctx, t, url, `{"model":"m","input":"weather?","max_output_tokens":2,"stream":true,`+tools+`}`, nil)
	names, ev = namedEvents(t, resp.Body)
	resp.Body.Close()
	var streamed string
	for _, e := range ev {
		if e["type"] == "response.function_call_arguments.delta" {
			streamed += e["delta"].(string)
		}
	}
	last := ev[len(ev)-1]["response"].(map[string]any)["output"].([]any)[0].(map[string]any)
	if names[len(names)-1] != "response.completed" || streamed != last["arguments"] || json.Unmarshal([]byte(streamed), &args) != nil {
		t.Errorf("function call stream: events %v, deltas %q, final %v", names, streamed, last)
	}

	resp = post(ctx, t, url, `{"model":"m","input":"x","previous_response_id":"resp_1"}`, nil)
	if e := decode(t, resp); resp.StatusCode != 400 || e["error"] == nil {
		t.Errorf("previous_response_id: %d %v", resp.StatusCode, e)
	}
}

// TestMessagesAPI: /v1/messages in @anthropic-ai/sdk's shapes (1.16.0,
// resources/messages/messages.d.ts), text and tool use, streamed and
// not, and errors in Anthropic's shape.
func TestMessagesAPI(t *testing.T) {
	_, hs, _ := startServer(t, ServerConfig{Model: "m"})
	ctx := testenv.Context(t)
	url := hs.URL + "/v1/messages"
	tools := `"tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]`

	m := decode(t, post(ctx, t, url, `{"model":"m","max_tokens":3,"system":"be brief","messages":[{"role":"user","content":"hello there"}]}`, nil))
	block := m["content"].([]any)[0].(map[string]any)
	if m["type"] != "message" || m["stop_reason"] != "max_tokens" || block["type"] != "text" || len(strings.Fields(block["text"].(string))) != 3 {
		t.Errorf("message %v", m)
	}
	if u := m["usage"].(map[string]any); u["output_tokens"] != 3.0 || u["input_tokens"].(float64) < 1 || u["cache_read_input_tokens"] == nil {
		t.Errorf("usage %v", u)
	}
	m = decode(t, post(ctx, t, url, `{"model":"m","max_tokens":2,`+tools+`,"messages":[{"role":"user","content":"weather?"}]}`, nil))
	block = m["content"].([]any)[0].(map[string]any)
	if in, _ := block["input"].(map[string]any); m["stop_reason"] != "tool_use" || block["type"] != "tool_use" || block["name"] != "get_weather" || in["city"] == "" {
		t.Errorf("tool use %v", m)
	}
	m = decode(t, post(ctx, t, url, `{"model":"m","max_tokens":2,`+tools+`,"messages":[{"role":"user","content":"weather?"},`+
		`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},`+
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}]}`, nil))
	if m["stop_reason"] != "max_tokens" {
		t.Errorf("after tool_result: %v", m)
	}

	resp := post(ctx, t, url, `{"model":"m","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	names, _ := namedEvents(t, resp.Body)
	resp.Body.Close()
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	resp = post(ctx, t, url, `{"model":"m","max_tokens":2,"stream":true,`+tools+`,"messages":[{"role":"user","content":"weather?"}]}`, nil)
	_, ev := namedEvents(t, resp.Body)
	resp.Body.Close()
	var partial string
	for _, e := range ev {
		if d, ok := e["delta"].(map[string]any); ok && d["type"] == "input_json_delta" {
			partial += d["partial_json"].(string)
		}
	}
	var in map[string]string
	if err := json.Unmarshal([]byte(partial), &in); err != nil || in["city"] == "" {
		t.Errorf("input_json_delta pieces %q: %v", partial, err)
	}

	for _, tc := range []struct {
		body   string
		status int
		typ    string
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error"},
		{`{"model":"nope","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error"},
		{`{"model":"m","max_tokens":2,"messages":[`, 400, "invalid_request_error"},
	} {
		resp := post(ctx, t, url, tc.body, nil)
		e := decode(t, resp)
		if inner, _ := e["error"].(map[string]any); resp.StatusCode != tc.status || e["type"] != "error" || inner["type"] != tc.typ || inner["message"] == "" {
			t.Errorf("%s: %d %v, want %d with Anthropic's error type %s", tc.body, resp.StatusCode, e, tc.status, tc.typ)
		}
	}
}

// TestModelByID: GET /v1/models/{id} in each client's shape.
func TestModelByID(t *testing.T) {
	_, hs, _ := startServer(t, ServerConfig{Model: "m", LoRAs: []string{"a/lora"}})
	ctx := testenv.Context(t)
	get := func(path string, anthropic bool) (int, map[string]any) {
		req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+path, nil)
		if anthropic {
			req.Header.Set("anthropic-version", "2023-06-01")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, decode(t, resp)
	}
	if code, m := get("/v1/models/m", false); code != 200 || m["object"] != "model" || m["id"] != "m" {
		t.Errorf("openai: %d %v", code, m)
	}
	if code, m := get("/v1/models/a%2Flora", false); code != 200 || m["id"] != "a/lora" || m["parent"] != "m" {
		t.Errorf("lora: %d %v", code, m)
	}
	if code, m := get("/v1/models/m", true); code != 200 || m["type"] != "model" || m["display_name"] != "m" {
		t.Errorf("anthropic: %d %v", code, m)
	}
	if code, m := get("/v1/models", true); code != 200 || m["first_id"] != "m" || m["has_more"] != false {
		t.Errorf("anthropic list: %d %v", code, m)
	}
	if code, m := get("/v1/models/x", false); code != 404 || m["error"] == nil {
		t.Errorf("unknown: %d %v", code, m)
	}
	if code, m := get("/v1/models/x", true); code != 404 || m["type"] != "error" {
		t.Errorf("unknown, anthropic: %d %v", code, m)
	}
}

// FuzzParseAPIs: any body either is a complete 4xx or a generation with
// tokens that fits the context, on both fronts; the tool decision never
// panics.
func FuzzParseAPIs(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi","max_output_tokens":3,"stream":true}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}],"tools":[{"type":"function","name":"f","parameters":{"required":["a"]}}],"tool_choice":"required"}`,
		`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"f"}}`,
		`{"input":"x","previous_response_id":"r"}`, `{"max_tokens":1}`, `{`, `[]`,
	} {
		f.Add([]byte(s))
	}
	srv, err := NewServer(ServerConfig{Model: "m", MaxModelLen: 64}, ServerOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(g genRequest, chat *tokenizer.ChatRequest, e *httpError) {
			if e != nil {
				if e.status < 400 || e.status > 499 || e.message == "" {
					t.Fatalf("error %+v is not a complete 4xx", e)
				}
				return
			}
			if len(g.tokens) == 0 || g.maxTokens <= 0 || len(g.tokens)+g.maxTokens > 64 || chat == nil {
				t.Fatalf("accepted %d prompt + %d max tokens (context 64)", len(g.tokens), g.maxTokens)
			}
		}
		_, g, chat, e := srv.parseResponses(body)
		check(g, chat, e)
		if e == nil {
			chooseTool(chat)
		}
		_, g, chat, e = srv.parseMessages(body)
		check(g, chat, e)
		if e == nil {
			chooseTool(chat)
		}
	})
}
