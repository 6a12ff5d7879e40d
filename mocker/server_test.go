package mocker

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/tokenizer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}

// startServer serves a mocker on a loopback listener, its engine stepped
// in real time with a large speedup.
func startServer(t *testing.T, cfg ServerConfig) (*Server, *httptest.Server, *prometheus.Registry) {
	t.Helper()
	if cfg.Engine.Speedup == 0 {
		cfg.Engine.Speedup = 1000
	}
	reg := prometheus.NewRegistry()
	srv, err := NewServer(cfg, ServerOptions{Logger: testenv.Logger(t), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Run(ctx)
	}()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		cancel()
		<-done
	})
	return srv, hs, reg
}

func post(ctx context.Context, t *testing.T, url, body string, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestBadRequests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, hs, _ := startServer(t, ServerConfig{Model: "m", MaxBodyBytes: 1 << 10, Engine: Config{NumBlocks: 64}})
	tests := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"invalid json", "/v1/completions", `{"model":"m","prompt":`, 400, "invalid_json"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, 400, "missing_prompt"},
		{"empty prompt", "/v1/completions", `{"model":"m","prompt":""}`, 400, "missing_prompt"},
		{"prompt of wrong type", "/v1/completions", `{"model":"m","prompt":{"a":1}}`, 400, "invalid_prompt"},
		{"batched prompts", "/v1/completions", `{"model":"m","prompt":["a","b"]}`, 400, "unsupported_batch"},
		{"zero max_tokens", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":0}`, 400, "invalid_max_tokens"},
		{"negative max_tokens", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-3}`, 400, "invalid_max_tokens"},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"hi"}`, 404, "model_not_found"},
		{"chat without messages", "/v1/chat/completions", `{"model":"m"}`, 400, "missing_messages"},
		{"chat bad content", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`, 400, "invalid_message"},
		{"two choices", "/v1/completions", `{"model":"m","prompt":"hi","n":2}`, 400, "invalid_n"},
		{"too many logprobs", "/v1/completions", `{"model":"m","prompt":"hi","logprobs":1000000}`, 400, "invalid_logprobs"},
		{"too many top logprobs", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}`, 400, "invalid_top_logprobs"},
		{"too many stop sequences", "/v1/completions", `{"model":"m","prompt":"hi","stop":[` + strings.Repeat(`"x",`, MaxStopSequences) + `"y"]}`, 400, "invalid_stop"},
		{"stop of wrong type", "/v1/completions", `{"model":"m","prompt":"hi","stop":5}`, 400, "invalid_stop"},
		{"body too large", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x ", 1<<10) + `"}`, 413, "body_too_large"},
		{"tokenize unknown model", "/tokenize", `{"model":"x","prompt":"hi"}`, 404, "model_not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(ctx, t, hs.URL+tt.path, tt.body, nil)
			defer resp.Body.Close()
			var e apiError
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("error body: %v", err)
			}
			if resp.StatusCode != tt.status || e.Error.Code != tt.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("got %d %+v, want %d with code %q and a message and type", resp.StatusCode, e.Error, tt.status, tt.code)
			}
		})
	}
}

// TestContextLength: a prompt plus max_tokens past the model's context is
// vLLM's 400, word for word, and never allocates by max_tokens (a 10^12
// max_tokens used to size a channel and kill the process).
func TestContextLength(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, hs, _ := startServer(t, ServerConfig{Model: "m", MaxModelLen: 100, Engine: Config{NumBlocks: 64}})
	prompt := `[1,2,3,4,5,6,7,8,9,10]`
	tests := []struct {
		name, path, body, msg string
	}{
		{"max_tokens 1e12", "/v1/completions", `{"model":"m","prompt":` + prompt + `,"max_tokens":1000000000000}`,
			"'max_tokens' or 'max_completion_tokens' is too large: 1000000000000. This model's maximum context length is 100 tokens and your request has 10 input tokens (1000000000000 > 100 - 10)."},
		{"one past the context", "/v1/completions", `{"model":"m","prompt":` + prompt + `,"max_tokens":91}`,
			"'max_tokens' or 'max_completion_tokens' is too large: 91. This model's maximum context length is 100 tokens and your request has 10 input tokens (91 > 100 - 10)."},
		{"chat max_completion_tokens", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1000000000000,"stream":true}`,
			"'max_tokens' or 'max_completion_tokens' is too large: 1000000000000."},
		{"prompt fills the context", "/v1/completions", `{"model":"m","prompt":[` + strings.Repeat("1,", 99) + `1]}`,
			"This model's maximum context length is 100 tokens. However, your request has 100 input tokens. Please reduce the length of the input messages."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(ctx, t, hs.URL+tt.path, tt.body, nil)
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   any    `json:"param"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("error body: %v", err)
			}
			if resp.StatusCode != 400 || e.Error.Code != 400 || e.Error.Type != "BadRequestError" || !strings.HasPrefix(e.Error.Message, tt.msg) {
				t.Errorf("got %d %+v, want 400 BadRequestError %q", resp.StatusCode, e.Error, tt.msg)
			}
		})
	}
	// Exactly the room left is served; an unset max_tokens is capped to it.
	for _, body := range []string{`{"model":"m","prompt":` + prompt + `,"max_tokens":90}`, `{"model":"m","prompt":[` + strings.Repeat("1,", 95) + `1]}`} {
		resp := post(ctx, t, hs.URL+"/v1/completions", body, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: got %d, want 200", body, resp.StatusCode)
		}
	}
}

// sse reads an SSE body into its data payloads, up to [DONE].
func sse(t *testing.T, r io.Reader) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(r)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			break
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		out = append(out, m)
	}
	if !done {
		t.Fatal("stream ended without [DONE]")
	}
	return out
}

func TestStreamingCompletionWithUsage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, hs, _ := startServer(t, ServerConfig{Model: "m"})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			body := `{"model":"m","prompt":"the quick brown fox jumps over the lazy dog","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`
			if strings.Contains(path, "chat") {
				body = `{"model":"m","messages":[{"role":"user","content":"the quick brown fox"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`
			}
			resp := post(ctx, t, hs.URL+path, body, nil)
			defer resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			chunks := sse(t, resp.Body)
			text, finish := 0, ""
			for _, c := range chunks[:len(chunks)-1] {
				for _, ch := range c["choices"].([]any) {
					choice := ch.(map[string]any)
					s, _ := choice["text"].(string)
					if d, ok := choice["delta"].(map[string]any); ok {
						s, _ = d["content"].(string)
					}
					if s != "" {
						text++
					}
					if f, ok := choice["finish_reason"].(string); ok {
						finish = f
					}
				}
			}
			if text != 5 || finish != "length" {
				t.Errorf("got %d text chunks, finish %q; want 5, length", text, finish)
			}
			last := chunks[len(chunks)-1]
			u, ok := last["usage"].(map[string]any)
			if !ok || len(last["choices"].([]any)) != 0 {
				t.Fatalf("last chunk %v, want a usage chunk with no choices", last)
			}
			if u["completion_tokens"].(float64) != 5 || u["prompt_tokens"].(float64) <= 0 ||
				u["total_tokens"].(float64) != u["prompt_tokens"].(float64)+5 {
				t.Errorf("usage %v", u)
			}
		})
	}
}

func TestNonStreamingAndInfo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, hs, _ := startServer(t, ServerConfig{Model: "m", LoRAs: []string{"ad"}})

	// Token-id prompt, then the same prompt again: the second hits the cache.
	prompt := `[` + strings.TrimSuffix(strings.Repeat("7,", 40), ",") + `]`
	var cached []float64
	for range 2 {
		resp := post(ctx, t, hs.URL+"/v1/completions", `{"model":"m","prompt":`+prompt+`,"max_tokens":3}`, nil)
		var out struct {
			Object  string `json:"object"`
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if out.Object != "text_completion" || len(out.Choices) != 1 || len(strings.Fields(out.Choices[0].Text)) != 3 || out.Choices[0].FinishReason != "length" {
			t.Fatalf("response %+v", out)
		}
		cached = append(cached, out.Usage["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64))
	}
	if cached[0] != 0 || cached[1] != 32 {
		t.Errorf("cached tokens %v, want [0 32] (40-token prompt, blocks of 16)", cached)
	}

	resp := post(ctx, t, hs.URL+"/v1/chat/completions", `{"model":"ad","messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}],"max_completion_tokens":2}`, nil)
	var chat struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct{ Role, Content string } `json:"message"`
		} `json:"choices"`
	}
	json.NewDecoder(resp.Body).Decode(&chat)
	resp.Body.Close()
	if chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Choices[0].Message.Role != "assistant" || chat.Choices[0].Message.Content == "" {
		t.Errorf("chat response %+v", chat)
	}

	resp = post(ctx, t, hs.URL+"/tokenize", `{"model":"m","prompt":"a b, c"}`, nil)
	var tok struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if tok.Count != 4 || len(tok.Tokens) != 4 {
		t.Errorf("tokenize = %+v, want 4 tokens (a b , c)", tok)
	}

	get := func(path string) string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
		return string(b)
	}
	if m := get("/v1/models"); !strings.Contains(m, `"id":"m"`) || !strings.Contains(m, `"id":"ad"`) {
		t.Errorf("models = %s", m)
	}
	get("/health")
	metrics := get("/metrics")
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		`vllm:prefix_cache_queries_total{engine="0",model_name="m"}`, `vllm:prefix_cache_hits_total{engine="0",model_name="m"} 32`,
		"vllm:time_to_first_token_seconds_bucket", `vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="2560"}`,
		"vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_count",
		"vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
		`vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="m",le="7680"}`,
	} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestPrefillRoleReportsKVReady(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, hs, _ := startServer(t, ServerConfig{Model: "m", WorkerID: "p1", Address: "10.0.0.1:8000", Engine: Config{Role: "prefill"}})
	resp := post(ctx, t, hs.URL+"/v1/completions", `{"prompt":"a b c d","max_tokens":50}`, nil)
	defer resp.Body.Close()
	var out struct {
		Usage            usage          `json:"usage"`
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	if out.Usage.CompletionTokens != 1 || out.KVTransferParams["remote_engine_id"] != "p1" {
		t.Errorf("prefill response %+v, want 1 token and kv_transfer_params from p1", out)
	}
}

func TestDecodeRoleSkipsPrefill(t *testing.T) {
	// In virtual time: a remote-prefilled request costs the KV transfer and
	// one decode step, not a prefill.
	eng, _ := NewEngine(Config{Role: "decode", KVBytesPerToken: 1000, KVTransferBandwidth: 1e6})
	p := prompt(3, 2000)
	if err := eng.Submit(t0, Request{ID: "r", Tokens: p, MaxTokens: 2, RemotePrefill: true}); err != nil {
		t.Fatal(err)
	}
	blocks := map[uint64]struct{}{}
	c := run(t, eng, t0, blocks)["r"]
	transfer := 2 * time.Second // 2000 tokens × 1000 B / 1 MB/s
	decode := DefaultTiming{}.IterationTime(Batch{DecodeSeqs: 1, KVUsage: float64(blocksFor(2000, 16)) / 8192})
	if got, want := c.TTFT(), transfer+decode; got != want {
		t.Errorf("TTFT = %v, want transfer %v + one decode step %v", got, transfer, decode)
	}
	if len(blocks) != 2000/16 {
		t.Errorf("cached blocks after the transfer = %d, want %d", len(blocks), 2000/16)
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3]}`, `{"prompt":[[1,2]]}`, `{"prompt":["x"]}`, `{"prompt":null}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"max_tokens":-1}`, `{`, `[]`, `""`,
		`{"prompt":[1],"max_tokens":1000000000000}`, `{"prompt":"a","n":1,"stop":["x"],"logprobs":3}`,
		`{"messages":[{"role":"user","content":"a"}],"n":9,"top_logprobs":99,"stop":"s"}`,
		`{"prompt":"a","cache_salt":"t"}`, `{"prompt":"a","cache_salt":""}`, `{"messages":[{"role":"user","content":"a"}],"cache_salt":5}`,
	} {
		f.Add([]byte(s))
	}
	srv, err := NewServer(ServerConfig{Model: "m", LoRAs: []string{"l"}, MaxModelLen: 64}, ServerOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte) (genRequest, *httpError){srv.parseCompletion, srv.parseChat} {
			g, e := parse(body)
			if e != nil {
				if e.status < 400 || e.status > 499 || e.code == "" || e.message == "" {
					t.Fatalf("error %+v is not a complete 4xx", e)
				}
				continue
			}
			if len(g.tokens) == 0 || g.maxTokens <= 0 {
				t.Fatalf("accepted request without tokens or max tokens: %+v", g)
			}
			if len(g.tokens)+g.maxTokens > 64 {
				t.Fatalf("accepted %d prompt + %d max tokens past the context of 64", len(g.tokens), g.maxTokens)
			}
		}
		rec := httptest.NewRecorder()
		srv.tokenize(rec, httptest.NewRequest(http.MethodPost, "/tokenize", strings.NewReader(string(body))))
		if rec.Code != 200 && (rec.Code < 400 || rec.Code > 499) {
			t.Fatalf("tokenize status %d", rec.Code)
		}
	})
}

func TestClientGoneFreesRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, hs, _ := startServer(t, ServerConfig{Model: "m", Engine: Config{Speedup: 1}})
	reqCtx, hangUp := context.WithCancel(ctx)
	resp := post(reqCtx, t, hs.URL+"/v1/completions", `{"prompt":"a b c","max_tokens":100000,"stream":true}`, nil)
	// Read the first chunk, then go away.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	if st := srv.Stats(); st.Running != 1 {
		t.Fatalf("running = %d, want 1", st.Running)
	}
	hangUp()
	resp.Body.Close()
	for srv.Stats().Running != 0 || srv.Stats().UsedBlocks != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("request still running after the client left: %+v", srv.Stats())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestStreamHeadersBeforeFirstToken: a streaming request's 200 and
// headers go out as soon as the engine has it, before its first token, as
// vLLM's do (starlette/responses.py, StreamingResponse.stream_response:
// http.response.start is sent before the body iterator runs). The second
// request here can never be admitted (MaxNumSeqs 1, the first never ends
// in the test), so it would never have headers if they waited for a token.
func TestStreamHeadersBeforeFirstToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, hs, _ := startServer(t, ServerConfig{Model: "m", Engine: Config{Speedup: 1, MaxNumSeqs: 1}})
	first := post(ctx, t, hs.URL+"/v1/completions", `{"prompt":"a b c","max_tokens":100000,"stream":true}`, nil)
	defer first.Body.Close()
	if line, err := bufio.NewReader(first.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first request's first line %q: %v", line, err)
	}
	second := post(ctx, t, hs.URL+"/v1/completions", `{"prompt":"d e f","max_tokens":10,"stream":true}`, nil)
	defer second.Body.Close()
	if second.StatusCode != http.StatusOK || second.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("second request: %d %v", second.StatusCode, second.Header)
	}
	if st := srv.Stats(); st.Running != 1 || st.Waiting != 1 {
		t.Fatalf("stats %+v, want 1 running and 1 waiting (headers before admission)", st)
	}
}

// TestRenderChat: the exported template is the one the server encodes chats
// with (/tokenize with messages gives the ids of RenderChat's text), so a
// router using it computes the workers' token ids.
func TestRenderChat(t *testing.T) {
	msgs := []tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "héllo, world"}}
	if got, want := RenderChat(msgs, true), "<|system|>\nBe brief.\n<|user|>\nhéllo, world\n<|assistant|>\n"; got != want {
		t.Errorf("RenderChat(…, true) = %q, want %q", got, want)
	}
	if got, want := RenderChat(msgs[:1], false), "<|system|>\nBe brief.\n"; got != want {
		t.Errorf("RenderChat(…, false) = %q, want %q", got, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, hs, _ := startServer(t, ServerConfig{Model: "m"})
	resp := post(ctx, t, hs.URL+"/tokenize", `{"model":"m","messages":[{"role":"system","content":"Be brief."},`+
		`{"role":"user","content":[{"type":"text","text":"héllo, "},{"type":"image_url"},{"type":"text","text":"world"}]}]}`, nil)
	defer resp.Body.Close()
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil {
		t.Fatal(err)
	}
	// Parts are flattened as vLLM does: the image's placeholder first,
	// text parts joined with "\n".
	parts := []tokenizer.Message{msgs[0], {Role: "user", Content: tokenizer.DefaultImagePlaceholder + "\nhéllo, \nworld"}}
	want, err := WordTokenizer{}.Encode(RenderChat(parts, true))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, tok.Tokens); diff != "" {
		t.Errorf("/tokenize of the messages (-RenderChat's ids +got):\n%s", diff)
	}
}

// TestChatTokenizerMatchesRouter: a mocker given the router's tokenizer
// (the openai backend, as `kvgate mocker -tokenizer openai` and `kvgate up`
// configure it) caches a text prompt or chat sent twice under the block
// ids the router hashes for it; with the word tokenizer it did not.
func TestChatTokenizerMatchesRouter(t *testing.T) {
	tok, err := tokenizer.Load(tokenizer.Config{Model: "m", Backend: tokenizer.BackendOpenAI, Encoding: "cl100k_base"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct{ path, body string }{
		{tokenizer.PathChat, `{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Tell me about prefix caches and why routers care about them."}]}`},
		{tokenizer.PathCompletions, `{"model":"m","max_tokens":1,"prompt":"Prefix caches keep the KV blocks of earlier prompts, so a router that knows them saves prefill."}`},
	} {
		srv, hs, _ := startServer(t, ServerConfig{Model: "m", Tokenizer: tok, Engine: Config{BlockSize: 4}})
		for range 2 {
			resp := post(ctx, t, hs.URL+tc.path, tc.body, nil)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s: status %d", tc.path, resp.StatusCode)
			}
		}
		// The router's ids for the same body (globalrouter: Encode or
		// EncodeChat of what ParseBody read).
		parsed, err := tokenizer.ParseBody(tc.path, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var ids []uint32
		if parsed.Chat != nil {
			ids, err = tok.EncodeChat(parsed.Chat)
		} else {
			ids, err = tok.Encode(parsed.Prompt)
		}
		if err != nil {
			t.Fatal(err)
		}
		local, err := kvevents.LocalHashes(ids, 4, "")
		if err != nil || len(local) < 4 {
			t.Fatalf("%d blocks (%v)", len(local), err)
		}
		cached := srv.CachedBlocks()
		for i, h := range kvevents.SequenceHashes(local) {
			if _, ok := cached[h]; !ok {
				t.Fatalf("%s: block %d of the router's %d (%d) is not in the mocker's cache", tc.path, i, len(local), h)
			}
		}
	}
}

// TestConfigureHTTPServerH2C: a server so configured answers h2c (prior
// knowledge) and HTTP/1.1 alike.
func TestConfigureHTTPServerH2C(t *testing.T) {
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Proto)
	}))
	ConfigureHTTPServer(hs.Config)
	hs.Start()
	defer hs.Close()
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	for _, tc := range []struct {
		tr   *http.Transport
		want string
	}{{&http.Transport{Protocols: &h2}, "HTTP/2.0"}, {&http.Transport{}, "HTTP/1.1"}} {
		resp, err := (&http.Client{Transport: tc.tr}).Get(hs.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tc.tr.CloseIdleConnections()
		if string(b) != tc.want {
			t.Errorf("got %q, want %q", b, tc.want)
		}
	}
}
