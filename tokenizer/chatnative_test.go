package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// knownTemplates are the templates with a native renderer, loaded as the
// tokenizer loads them.
func knownTemplates(t testing.TB) map[string]*chatTemplate {
	t.Helper()
	out := map[string]*chatTemplate{}
	add := func(name, source string, vars map[string]any) {
		ct, err := newChatTemplate(source, vars)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ct.native == nil {
			t.Fatalf("%s: no native renderer (is the source still the one chatnative.go hashes?)", name)
		}
		out[name] = ct
	}
	add("chatml", chatMLTemplate, nil)
	llama3, err := os.ReadFile(filepath.Join("testdata", "llama3_chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	add("llama3", string(llama3), map[string]any{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
	dir := referenceDir(t)
	data, err := os.ReadFile(filepath.Join(dir, "models", "qwen3", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	add("qwen3", cfg.ChatTemplate, nil)
	return out
}

// pieces are what generated contents are made of: the templates' own
// markers, whitespace of every kind the string methods treat apart,
// Jinja syntax, escapes, non-ASCII and invalid UTF-8.
var pieces = []string{
	"", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u2028", "\u3000", "\v", "\f",
	"hello", "What is 2+2?", "Paragraph: a router that knows which worker holds a prompt's prefix. ",
	"<think>", "</think>", "<think>\nreasoning\n</think>\n\n", "<tool_response>", "</tool_response>",
	"<|im_start|>", "<|im_end|>", "<|eot_id|>", "{{ x }}", "{% if %}", "{#", "<>&\"'", "\\n",
	"中文", "🎉", "é", "\xff", "\xe4\xb8", "\x00",
}

var roles = []string{"system", "user", "assistant", "tool", "user", "assistant", "developer", ""}

func genContent(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(7) {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

func genConversation(r *rand.Rand) []Message {
	n := r.IntN(9)
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Role: roles[r.IntN(len(roles))], Content: genContent(r)}
	}
	if n > 0 && r.IntN(3) == 0 {
		msgs[0].Role = "system"
	}
	return msgs
}

// genTools are tool lists with what tojson must print as Python does:
// key order, nesting, unicode, escapes, floats and integers.
var genTools = []string{
	`[{"type":"function","function":{"name":"get_weather","description":"Weather – now","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`,
	`[{"function":{"parameters":{},"name":"z"},"type":"function"},{"type":"function","function":{"name":"a\"b<>&'","description":"中文 🎉\n\t\u0001","strict":true,"x":[1,2.5,-0.001,1e21,null,false]}}]`,
	`[{"type":"function","function":{"name":"dup","name":"dup2","n":12345678901234567890}}]`,
}

var genArgs = []string{`{"city":"Paris","unit":"c"}`, `"{\"a\": [1, 2.5]}"`, `"not json"`, `{}`, `{"q":"é\"\\","n":{"d":[true,null]}}`, `[1,2]`, `""`}

var genKwargs = []string{"", `{"enable_thinking":false}`, `{"enable_thinking":true}`, `{"enable_thinking":"false"}`, `{"reasoning_effort":"low"}`, `{"enable_thinking":true,"enable_thinking":false}`, `{"tools":[]}`}

// genRequest dresses a generated conversation as a whole chat request:
// tools, tool calls, tool results, reasoning, names, kwargs and
// continue_final_message, each now and then.
func genRequest(r *rand.Rand, msgs []Message, gen bool) *ChatRequest {
	req := &ChatRequest{Messages: msgs, AddGenerationPrompt: gen}
	if r.IntN(3) == 0 {
		req.Tools = []byte(genTools[r.IntN(len(genTools))])
	}
	if r.IntN(3) == 0 {
		req.TemplateKwargs = []byte(genKwargs[r.IntN(len(genKwargs))])
	}
	for i := range msgs {
		m := &msgs[i]
		switch {
		case m.Role == "assistant" && r.IntN(2) == 0:
			for range 1 + r.IntN(2) {
				m.ToolCalls = append(m.ToolCalls, ToolCall{ID: "c", Type: "function", Function: FunctionCall{Name: sanitizeUTF8(genContent(r)), Arguments: []byte(genArgs[r.IntN(len(genArgs))])}})
			}
			if r.IntN(2) == 0 {
				// ParseBody makes every string valid UTF-8.
				m.ReasoningContent = sanitizeUTF8(genContent(r))
			}
		case m.Role == "tool":
			m.ToolCallID = "c"
		}
		if r.IntN(5) == 0 {
			m.Name = "n"
		}
	}
	if !gen && len(msgs) > 0 && r.IntN(4) == 0 {
		req.ContinueFinalMessage = true
	}
	return req
}

// TestNativeChatMatchesJinja proves each native renderer byte-identical to
// gonja over generated requests (and equal in refusing the few it leaves
// to gonja).
func TestNativeChatMatchesJinja(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	convs := [][]Message{nil, {}, {{Role: "user", Content: "Hello!"}}}
	for range 3000 {
		convs = append(convs, genConversation(r))
	}
	for name, ct := range knownTemplates(t) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			native, gonjaFails, extras := 0, 0, 0
			for i, base := range convs {
				for _, gen := range []bool{false, true} {
					msgs := append([]Message(nil), base...)
					req := &ChatRequest{Messages: msgs, AddGenerationPrompt: gen}
					if i%2 == 1 {
						req = genRequest(r, msgs, gen)
					}
					want, werr := ct.renderJinja(req)
					got, ok := ct.native(req)
					if !ok {
						continue
					}
					if req.ContinueFinalMessage {
						var cerr error
						if got, cerr = continueFinal(got, msgs); cerr != nil {
							if werr == nil {
								t.Fatalf("request %d: native+continue fails (%v) where gonja renders", i, cerr)
							}
							continue
						}
					}
					if i%2 == 1 {
						extras++
					}
					native++
					if werr != nil {
						// gonja cannot call a string method on an empty
						// string (Qwen3's "</think>" split of a turn that
						// ends or starts with it); Python's Jinja, which
						// the engines use, can: TestNativeQwen3WhereGonjaFails.
						if name != "qwen3" || !strings.Contains(werr.Error(), "is not callable on") {
							t.Fatalf("conversation %d gen=%v %s: gonja fails (%v) where native renders %q", i, gen, showReq(req), werr, got)
						}
						gonjaFails++
						continue
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("conversation %d gen=%v %s: native differs from gonja (-gonja +native):\n%s", i, gen, showReq(req), diff)
					}
				}
			}
			if native < len(convs) || extras < len(convs)/2 {
				t.Errorf("native rendered %d of %d (%d with tools, calls, kwargs...); want most", native, 2*len(convs), extras)
			}
			if gonjaFails > native/10 {
				t.Errorf("gonja failed on %d of %d", gonjaFails, native)
			}
		})
	}
}

// TestNativeQwen3WhereGonjaFails: where gonja fails on Qwen3's template
// (a string method on an empty string), the native renderer gives what
// Python's Jinja gives (jinja2 3.1.6, as transformers configures it:
// sandboxed, trim_blocks, lstrip_blocks). Over the generated conversations
// of TestNativeChatMatchesJinja that are valid UTF-8, all three native
// renderers matched jinja2 on every one (6,000+ renders), these included.
func TestNativeQwen3WhereGonjaFails(t *testing.T) {
	ct := knownTemplates(t)["qwen3"]
	for _, tc := range []struct {
		msgs []Message
		want string
	}{
		{[]Message{{Role: "user", Content: "2+2?"}, {Role: "assistant", Content: "<think>\nadd\n</think>"}},
			"<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>\n\n<|im_end|>\n<|im_start|>assistant\n"},
		{[]Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "</think>\n\nhello"}},
			"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhello<|im_end|>\n<|im_start|>assistant\n"},
		{[]Message{{Role: "user", Content: "q"}, {Role: "assistant", Content: "<think>x</think>  a"}, {Role: "user", Content: "r"}},
			"<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n  a<|im_end|>\n<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\n"},
	} {
		got, err := ct.render(&ChatRequest{Messages: tc.msgs, AddGenerationPrompt: true})
		if err != nil {
			t.Fatalf("render %s: %v", show(tc.msgs), err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("render %s differs from jinja2 (-jinja2 +native):\n%s", show(tc.msgs), diff)
		}
	}
}

func showReq(req *ChatRequest) string {
	return fmt.Sprintf("%s tools=%s kwargs=%s continue=%v", show(req.Messages), req.Tools, req.TemplateKwargs, req.ContinueFinalMessage)
}

func show(msgs []Message) string {
	b, _ := json.Marshal(msgs)
	return string(b)
}

// TestNativeChatRecognition: only the exact sources get a native renderer.
func TestNativeChatRecognition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		source string
		vars   map[string]any
		native bool
	}{
		{"chatml", chatMLTemplate, nil, true},
		{"chatml edited", chatMLTemplate + " ", nil, false},
		{"llama3 without bos_token", mustRead(t, "testdata/llama3_chat_template.jinja"), nil, false},
		{"mistral", mustRead(t, "testdata/mistral_chat_template.jinja"), map[string]any{"bos_token": "<s>", "eos_token": "</s>"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct, err := newChatTemplate(tc.source, tc.vars)
			if err != nil {
				t.Fatal(err)
			}
			if got := ct.native != nil; got != tc.native {
				t.Errorf("native renderer: got %v, want %v", got, tc.native)
			}
		})
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// BenchmarkRenderChat renders an ~8 KB conversation natively and through
// gonja.
func BenchmarkRenderChat(b *testing.B) {
	ct, err := newChatTemplate(chatMLTemplate, nil)
	if err != nil {
		b.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "You are a helpful assistant."}}
	for i := range 6 {
		msgs = append(msgs, Message{Role: "user", Content: fmt.Sprintf("Question %d: %s", i, strings.Repeat("tokens and caches ", 30))},
			Message{Role: "assistant", Content: strings.Repeat("an answer about routing ", 30)})
	}
	req := NewChat(msgs...)
	b.Run("native", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ct.render(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gonja", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ct.renderJinja(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestNativeFallsBackToJinja: each native renderer takes tools, tool
// calls, tool results, reasoning, names, enable_thinking and
// continue_final_message (TestNativeChatMatchesJinja proves it
// byte-identical to gonja on them); a request whose chat_template_kwargs
// name a variable the template reads (messages, tools, bos_token, ...),
// and an empty conversation for Qwen3, go through gonja.
func TestNativeFallsBackToJinja(t *testing.T) {
	user := Message{Role: "user", Content: "hi"}
	for name, ct := range knownTemplates(t) {
		used := false
		native := ct.native
		ct.native = func(req *ChatRequest) (string, bool) {
			out, ok := native(req)
			used = ok
			return out, ok
		}
		for _, tc := range []struct {
			name   string
			req    *ChatRequest
			native bool
		}{
			{"plain", NewChat(user), true},
			{"null content", NewChat(Message{Role: "assistant", NullContent: true}, user), true},
			{"tools", &ChatRequest{Messages: []Message{user}, Tools: []byte(`[{"type":"function","function":{"name":"f"}}]`)}, true},
			{"enable_thinking", &ChatRequest{Messages: []Message{user}, TemplateKwargs: []byte(`{"enable_thinking":false}`), AddGenerationPrompt: true}, true},
			{"continue", &ChatRequest{Messages: []Message{user, {Role: "assistant", Content: "he"}}, ContinueFinalMessage: true}, true},
			{"tool call", NewChat(user, Message{Role: "assistant", ToolCalls: []ToolCall{{Type: "function", Function: FunctionCall{Name: "f", Arguments: []byte(`{"a":1}`)}}}}), true},
			{"tool result", NewChat(user, Message{Role: "tool", ToolCallID: "c1", Content: "x"}), true},
			{"reasoning", NewChat(user, Message{Role: "assistant", Content: "4", ReasoningContent: "r"}), true},
			{"kwarg named bos_token", &ChatRequest{Messages: []Message{user}, TemplateKwargs: []byte(`{"bos_token":"<x>"}`)}, false},
			{"kwarg named tools", &ChatRequest{Messages: []Message{user}, TemplateKwargs: []byte(`{"tools":[]}`)}, false},
		} {
			used = false
			got, err := ct.render(tc.req)
			if err != nil {
				t.Fatalf("%s/%s: %v", name, tc.name, err)
			}
			if used != tc.native {
				t.Errorf("%s/%s: native renderer used = %v, want %v", name, tc.name, used, tc.native)
			}
			want, err := ct.renderJinja(tc.req)
			if err != nil || got != want {
				t.Errorf("%s/%s: render = %q, gonja = %q (%v)", name, tc.name, got, want, err)
			}
		}
	}
}

// BenchmarkRenderAgent renders the reference's agent request (Qwen3, a
// system prompt, 3 tools, 10 messages with 3 tool calls) natively and
// through gonja.
func BenchmarkRenderAgent(b *testing.B) {
	dir := referenceDir(b)
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		b.Fatal(err)
	}
	var ref struct {
		Requests []referenceRequest `json:"requests"`
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		b.Fatal(err)
	}
	var req *ChatRequest
	for _, c := range ref.Requests {
		if c.Template == "qwen3" && c.Name == "agent_tools" {
			body, err := ParseBody(PathChat, c.Request)
			if err != nil {
				b.Fatal(err)
			}
			req = body.Chat
		}
	}
	if req == nil {
		b.Skip("no agent_tools request in reference.json")
	}
	m := referenceModel(b, dir, "qwen3")
	b.Run("native", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.chat.render(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gonja", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.chat.renderJinja(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzNativeQwen3: over fuzzed chat bodies, the native Qwen3 renderer
// equals gonja wherever gonja renders (it fails on string methods of empty
// strings, where the native one follows Python's Jinja:
// TestNativeQwen3WhereGonjaFails).
func FuzzNativeQwen3(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\": [1, 2.5, \"é\"]}"}}]},{"role":"tool","tool_call_id":"a","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","reasoning_content":"r"}],"chat_template_kwargs":{"enable_thinking":false}}`,
		`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"<think>x</think>y"}],"continue_final_message":true}`,
	} {
		f.Add([]byte(s))
	}
	ct := knownTemplates(f)["qwen3"]
	if ct == nil {
		f.Skip("no qwen3 template")
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := ParseBody(PathChat, body)
		if err != nil {
			return
		}
		want, werr := ct.renderJinja(b.Chat)
		got, ok := ct.native(b.Chat)
		if !ok || werr != nil {
			return
		}
		if b.Chat.ContinueFinalMessage {
			if got, err = continueFinal(got, b.Chat.Messages); err != nil {
				t.Fatalf("continue: %v where gonja rendered", err)
			}
		}
		if got != want {
			t.Fatalf("native differs from gonja on %s:\n%s", body, cmp.Diff(want, got))
		}
	})
}
