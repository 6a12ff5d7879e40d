package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func mustLoad(t testing.TB, cfg Config) *Model {
	t.Helper()
	m, err := Load(cfg)
	if err != nil {
		t.Fatalf("Load(%+v): %v", cfg, err)
	}
	return m
}

func TestTinyByteLevel(t *testing.T) {
	m := loadTiny(t, tinyByteLevel(), "")
	bos := m.tok.(*hfTokenizer).prefix[0]
	vocab := m.tok.(*hfTokenizer).vocab
	tests := []struct {
		text string
		want []uint32
	}{
		{"", []uint32{bos}},
		{" the", []uint32{bos, vocab[" the"]}},
		// ignore_merges: " you" is in the vocab, so it is one token.
		{"the you", []uint32{bos, vocab["t"], vocab["he"], vocab[" you"]}},
		{"<|im_start|>in", []uint32{bos, bos + 1, vocab["in"]}},
	}
	for _, tc := range tests {
		got, err := m.Encode(tc.text)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Encode(%q) (-want +got):\n%s", tc.text, diff)
		}
	}
}

func TestTinySentencePiece(t *testing.T) {
	m := loadTiny(t, tinySentencePiece(), "")
	v := m.tok.(*hfTokenizer).vocab
	got, _ := m.Encode("the a€")
	// "▁the▁a€": merges give ▁the ▁a; € has no token, so its 3 bytes fall back.
	want := []uint32{1, v["▁the"], v["▁a"], v["<0xE2>"], v["<0x82>"], v["<0xAC>"]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Encode (-want +got):\n%s", diff)
	}
	text, err := m.Decode(got[1:])
	if err != nil || text != "the a€" {
		t.Errorf("Decode = %q, %v; want %q", text, err, "the a€")
	}
}

// A Metaspace pre-tokenizer (newer Llama-2 files) encodes as the legacy
// ▁ normalizer does.
func TestMetaspaceMatchesPrependNormalizer(t *testing.T) {
	legacy := loadTiny(t, tinySentencePiece(), "")
	f := tinySentencePiece()
	f["normalizer"] = nil
	f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}
	meta := loadTiny(t, f, "")
	// Not text that starts with a space: there the two differ, in the
	// reference implementation too (Metaspace prepends ▁ only when the
	// text does not start with one).
	for _, text := range []string{"the a", "there  in  ", "x", "a  b"} {
		a, _ := legacy.Encode(text)
		b, _ := meta.Encode(text)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Errorf("Encode(%q): metaspace differs from normalizer (-normalizer +metaspace):\n%s", text, diff)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tiny, _ := json.Marshal(tinyByteLevel())
	badMerge := strings.Replace(string(tiny), `["Ġ","t"]`, `["Ġ","zz"]`, 1)
	unsupported := strings.Replace(string(tiny), `"type":"BPE"`, `"type":"Unigram"`, 1)
	write("badcfg/tokenizer_config.json", `{"chat_template": `)
	tests := []struct {
		name    string
		cfg     Config
		wantErr []string // substrings of the error
		is      error
	}{
		{"missing file", Config{Backend: BackendHuggingFace, Path: filepath.Join(dir, "nope", "tokenizer.json")}, []string{"nope/tokenizer.json", "no such file"}, os.ErrNotExist},
		{"missing dir", Config{Backend: BackendHuggingFace, Path: filepath.Join(dir, "absent")}, []string{"absent"}, os.ErrNotExist},
		{"corrupt json", Config{Backend: BackendHuggingFace, Path: write("corrupt/tokenizer.json", `{"model": {"type": "BPE", "vocab": {"a": 0`)}, []string{"corrupt/tokenizer.json", "not a tokenizer.json"}, nil},
		{"empty file", Config{Backend: BackendHuggingFace, Path: write("empty/tokenizer.json", ``)}, []string{"empty/tokenizer.json", "not a tokenizer.json"}, nil},
		{"no model", Config{Backend: BackendHuggingFace, Path: write("nomodel/tokenizer.json", `{"version":"1.0"}`)}, []string{"nomodel/tokenizer.json", "no model"}, nil},
		{"bad merge", Config{Backend: BackendHuggingFace, Path: write("badmerge/tokenizer.json", badMerge)}, []string{"badmerge/tokenizer.json", "model.merges[0]", "missing from the vocab"}, nil},
		{"unsupported model", Config{Backend: BackendHuggingFace, Path: write("unigram/tokenizer.json", unsupported)}, []string{"unigram/tokenizer.json", "Unigram"}, ErrUnsupported},
		{"bad chat template", Config{Backend: BackendHuggingFace, Path: filepath.Dir(write("badtmpl/tokenizer.json", string(tiny))), ChatTemplate: write("badtmpl/t.jinja", "{% for %}")}, []string{"chat template"}, nil},
		{"corrupt tokenizer_config.json", Config{Backend: BackendHuggingFace, Path: filepath.Dir(write("badcfg/tokenizer.json", string(tiny)))}, []string{"badcfg/tokenizer_config.json"}, nil},
		{"no path", Config{Model: "m", Backend: BackendHuggingFace}, []string{`"m"`, "needs a path"}, ErrConfig},
		{"unknown backend", Config{Model: "m", Backend: "sentencepiece"}, []string{`"m"`, `unknown tokenizer backend "sentencepiece"`}, ErrConfig},
		{"no backend", Config{Model: "m"}, []string{"no tokenizer backend"}, ErrConfig},
		{"unknown encoding", Config{Backend: BackendOpenAI, Encoding: "p99k"}, []string{`"p99k"`, "cl100k_base"}, ErrConfig},
		{"remote without url", Config{Backend: BackendRemote}, []string{"needs a url"}, ErrConfig},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Load(tc.cfg)
			if err == nil {
				t.Fatalf("Load = %v, nil; want an error", m)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Load error %q does not contain %q", err, s)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("Load error %v is not %v", err, tc.is)
			}
		})
	}
}

// localModels are the backends that need no network or reference data.
func localModels(t testing.TB) map[string]*Model {
	return map[string]*Model{
		"cl100k_base":   mustLoad(t, Config{Backend: BackendOpenAI, Encoding: "cl100k_base"}),
		"o200k_base":    mustLoad(t, Config{Backend: BackendOpenAI, Encoding: "o200k_base"}),
		"bytelevel":     loadTiny(t, tinyByteLevel(), chatMLTemplate),
		"sentencepiece": loadTiny(t, tinySentencePiece(), ""),
		"estimate":      mustLoad(t, Config{Backend: BackendEstimate}),
	}
}

func TestBadInput(t *testing.T) {
	big := strings.Repeat("The quick brown fox, 敏捷的狐狸 🦊, jumps.\n  ", 1<<20/64)
	for name, m := range localModels(t) {
		t.Run(name, func(t *testing.T) {
			// Invalid UTF-8 reads as U+FFFD, byte by byte.
			bad, err := m.Encode("a\xffb\xc3")
			if err != nil {
				t.Fatal(err)
			}
			good, _ := m.Encode("a\uFFFDb\uFFFD")
			if diff := cmp.Diff(good, bad); diff != "" {
				t.Errorf("invalid UTF-8 (-as U+FFFD +got):\n%s", diff)
			}
			if _, err := m.Encode(""); err != nil {
				t.Errorf("Encode(\"\"): %v", err)
			}
			// A 1 MB prompt.
			ids, err := m.Encode(big)
			if err != nil || len(ids) < len(big)/16 {
				t.Fatalf("Encode(1 MB) = %d ids, %v", len(ids), err)
			}
			if name != "sentencepiece" {
				if h, ok := m.tok.(*hfTokenizer); ok {
					ids = ids[len(h.prefix):]
				}
				text, err := m.Decode(ids)
				if err != nil || text != big {
					t.Errorf("Decode(Encode(1 MB)) differs (%d bytes, %v)", len(text), err)
				}
			}
			if _, err := m.Decode([]uint32{0xFFFFFFFF}); !errors.Is(err, ErrUnknownID) {
				t.Errorf("Decode(0xFFFFFFFF) error = %v, want ErrUnknownID", err)
			}
		})
	}
}

func conversation(turns int) []Message {
	msgs := []Message{{Role: "system", Content: "You are a helpful assistant. Answer briefly."}}
	for i := 0; i < turns; i++ {
		msgs = append(msgs, Message{Role: "user", Content: fmt.Sprintf("Question %d: how do KV caches help with prefix %d? <|im_start|> is text here.\n\nThanks!", i, i*7)})
		msgs = append(msgs, Message{Role: "assistant", Content: fmt.Sprintf("Answer %d: they keep attention keys and values of the shared prefix, so prefill skips %d tokens.", i, i*16)})
	}
	return msgs
}

// EncodeChat with its cache equals tokenizing the rendered text without
// the tokens the model adds, turn after turn, from many goroutines.
func TestEncodeChatMatchesEncode(t *testing.T) {
	models := localModels(t)
	for _, name := range []string{"cl100k_base", "o200k_base", "bytelevel"} {
		m := models[name]
		t.Run(name, func(t *testing.T) {
			msgs := conversation(20)
			var wg sync.WaitGroup
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for turn := 1; turn <= len(msgs); turn++ {
						text, err := m.RenderChat(&ChatRequest{Messages: msgs[:turn], AddGenerationPrompt: true})
						if err != nil {
							t.Error(err)
							return
						}
						want := withoutPrefix(t, m, text)
						got, err := m.EncodeChat(&ChatRequest{Messages: msgs[:turn], AddGenerationPrompt: true})
						if err != nil {
							t.Error(err)
							return
						}
						if diff := cmp.Diff(want, got); diff != "" {
							t.Errorf("turn %d: EncodeChat differs from Encode(RenderChat) (-want +got):\n%s", turn, diff)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// withoutPrefix encodes text and drops the post-processor's tokens.
func withoutPrefix(t testing.TB, m *Model, text string) []uint32 {
	ids, err := m.Encode(text)
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := m.tok.(*hfTokenizer); ok {
		ids = ids[len(h.prefix) : len(ids)-len(h.suffix)]
	}
	return ids
}

func TestNoChatTemplate(t *testing.T) {
	m := loadTiny(t, tinySentencePiece(), "")
	if _, err := m.RenderChat(&ChatRequest{Messages: []Message{{Role: "user", Content: "hi"}}, AddGenerationPrompt: true}); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("RenderChat error = %v, want ErrNoChatTemplate", err)
	}
	if _, err := m.EncodeChat(&ChatRequest{Messages: []Message{{Role: "user", Content: "hi"}}, AddGenerationPrompt: true}); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("EncodeChat error = %v, want ErrNoChatTemplate", err)
	}
}

func TestChatTemplateOverride(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "t.jinja")
	if err := os.WriteFile(p, []byte("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := mustLoad(t, Config{Backend: BackendOpenAI, ChatTemplate: p})
	got, err := m.RenderChat(&ChatRequest{Messages: []Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "yo"}}, AddGenerationPrompt: false})
	if want := "[user] hi\n[assistant] yo\n"; err != nil || got != want {
		t.Errorf("RenderChat = %q, %v; want %q", got, err, want)
	}
}

func TestEstimate(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := mustLoad(t, Config{Model: "guess", Backend: BackendEstimate, Registerer: reg})
	if !m.Approximate() || m.Name() != "estimate" {
		t.Errorf("Approximate() = %v, Name() = %q", m.Approximate(), m.Name())
	}
	a, _ := m.Encode("hello world, again")
	b, _ := m.Encode("hello world, again and again")
	if len(a) != 5 || !cmp.Equal(a[:4], b[:4]) {
		t.Errorf("estimate ids not prefix-stable: %v vs %v", a, b)
	}
	for _, s := range []string{"", "a", "abcd", "héllo wörld 🦊"} {
		ids, _ := m.Encode(s)
		if got, err := m.Decode(ids); err != nil || got != s {
			t.Errorf("Decode(Encode(%q)) = %q, %v", s, got, err)
		}
	}
	want := `
# HELP kvgate_tokenizer_tokens_total Tokens produced by Encode and EncodeChat, by model and backend; approximate="true" for the estimate backend.
# TYPE kvgate_tokenizer_tokens_total counter
kvgate_tokenizer_tokens_total{approximate="true",backend="estimate",model="guess"} 19
`
	// 5 + 7 + 0 + 1 + 1 + 5 ids above.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvgate_tokenizer_tokens_total"); err != nil {
		t.Error(err)
	}
}

// fakeEngine is a vLLM-style /tokenize server over loopback: it tokenizes
// with the estimate backend and counts calls.
type fakeEngine struct {
	calls atomic.Int64
	block chan struct{} // if not nil, /tokenize waits on it or the request's end
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	if f.block != nil {
		select {
		case <-f.block:
		case <-r.Context().Done():
			return
		}
	}
	var req struct {
		Model    string    `json:"model"`
		Prompt   *string   `json:"prompt"`
		Messages []Message `json:"messages"`
		Tokens   []uint32  `json:"tokens"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "m1" {
		http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
		return
	}
	switch r.URL.Path {
	case "/tokenize":
		text := ""
		if req.Prompt != nil {
			text = *req.Prompt
		}
		for _, m := range req.Messages {
			text += m.Role + ": " + m.Content + "\n"
		}
		ids, _ := estimate{}.Encode(text)
		json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids), "max_model_len": 4096})
	case "/detokenize":
		s, _ := estimate{}.Decode(req.Tokens)
		json.NewEncoder(w).Encode(map[string]any{"prompt": s})
	default:
		http.NotFound(w, r)
	}
}

func TestRemote(t *testing.T) {
	eng := &fakeEngine{}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	m := mustLoad(t, Config{Model: "m1", Backend: BackendRemote, URL: srv.URL + "/", CacheSize: 2, HTTPClient: srv.Client()})
	want, _ := estimate{}.Encode("hello engine")
	for i := 0; i < 3; i++ {
		got, err := m.Encode("hello engine")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("Encode (-want +got):\n%s", diff)
		}
		got[0] = 0 // callers may modify what they get
	}
	if n := eng.calls.Load(); n != 1 {
		t.Errorf("engine called %d times for 3 identical prompts, want 1 (cached)", n)
	}
	// The cache is bounded: 3 new prompts evict the first.
	for _, s := range []string{"a", "b", "c", "hello engine"} {
		if _, err := m.Encode(s); err != nil {
			t.Fatal(err)
		}
	}
	if n := eng.calls.Load(); n != 5 {
		t.Errorf("engine called %d times, want 5", n)
	}
	chat, err := m.EncodeChat(&ChatRequest{Messages: []Message{{Role: "user", Content: "hi"}}, AddGenerationPrompt: true})
	if wantChat, _ := (estimate{}).Encode("user: hi\n"); err != nil || !cmp.Equal(chat, wantChat) {
		t.Errorf("EncodeChat = %v, %v; want %v", chat, err, wantChat)
	}
	if text, err := m.Decode(want); err != nil || text != "hello engine" {
		t.Errorf("Decode = %q, %v", text, err)
	}

	bad := mustLoad(t, Config{Model: "other", Backend: BackendRemote, URL: srv.URL, HTTPClient: srv.Client()})
	if _, err := bad.Encode("x"); err == nil || !strings.Contains(err.Error(), "status 400") {
		t.Errorf("Encode against a refusing engine: error = %v, want status 400", err)
	}
}

func TestRemoteTimeout(t *testing.T) {
	eng := &fakeEngine{block: make(chan struct{})}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	defer close(eng.block)
	m := mustLoad(t, Config{Model: "m1", Backend: BackendRemote, URL: srv.URL, Timeout: 50 * time.Millisecond, HTTPClient: srv.Client()})
	start := time.Now()
	_, err := m.Encode("slow")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Encode error = %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Encode returned after %v despite a 50ms timeout", d)
	}
}

func TestSet(t *testing.T) {
	s, err := LoadSet([]Config{{Model: "a", Backend: BackendEstimate}, {Model: "b", Backend: BackendOpenAI}})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.Model("b"); err != nil || m.Name() != "cl100k_base" {
		t.Errorf("Model(b) = %v, %v", m, err)
	}
	_, err = s.Model("gpt-9")
	if !errors.Is(err, ErrUnknownModel) || !strings.Contains(err.Error(), `"gpt-9"`) || !strings.Contains(err.Error(), "configured: a, b") {
		t.Errorf("Model(gpt-9) error = %v", err)
	}
	for _, cfgs := range [][]Config{
		{{Model: "a", Backend: BackendEstimate}, {Model: "a", Backend: BackendEstimate}},
		{{Backend: BackendEstimate}},
		{{Model: "x", Backend: "nope"}},
	} {
		if _, err := LoadSet(cfgs); !errors.Is(err, ErrConfig) {
			t.Errorf("LoadSet(%+v) error = %v, want ErrConfig", cfgs, err)
		}
	}
}

// A split pattern that is not hand-written still works, through regexp2.
func TestRegexpFallback(t *testing.T) {
	f := tinyByteLevel()
	pre := f["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)
	pre[0].(map[string]any)["pattern"] = map[string]any{"Regex": `\s+|\S+`}
	m := loadTiny(t, f, "")
	if !m.tok.(*hfTokenizer).slowSplit {
		t.Error("slowSplit = false")
	}
	ids, _ := m.Encode("the you  in")
	if got, _ := m.Decode(ids[1:]); got != "the you  in" {
		t.Errorf("round trip = %q", got)
	}
}

func TestChatCacheBounded(t *testing.T) {
	m := mustLoad(t, Config{Backend: BackendOpenAI, CacheSize: 8})
	m.cache.budget = 64 << 10
	for i := 0; i < 50; i++ {
		if _, err := m.EncodeChat(&ChatRequest{Messages: conversation(i%7 + 1), AddGenerationPrompt: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	c := m.cache
	if c.live > 8 {
		t.Errorf("cache holds %d entries, want <= 8", c.live)
	}
	checkChatCache(t, c)
	// A chunk bigger than its share is not cached.
	before := c.live
	big := strings.Repeat("word ", int(c.budget)/40)
	if _, err := m.EncodeChat(&ChatRequest{Messages: []Message{{Role: "user", Content: big}}, AddGenerationPrompt: false}); err != nil {
		t.Fatal(err)
	}
	for i := range c.slots {
		if s := &c.slots[i]; c.isLive(s) && s.size() > c.budget/16 {
			t.Errorf("a %d-byte chunk was cached (before: %d entries)", s.size(), before)
		}
	}
	checkChatCache(t, c)
}

// checkChatCache checks the chat cache's accounting against its slots and
// blocks: entries and bytes within the bounds, each counted once.
func checkChatCache(t *testing.T, c *chatCache) {
	t.Helper()
	var live int
	var held int64
	perBlock := map[uint32]int{}
	for i := range c.slots {
		s := &c.slots[i]
		if !c.isLive(s) {
			continue
		}
		live++
		held += s.size()
		perBlock[s.block-1-c.first]++
		if int(s.off)+int(s.size()) > len(c.bytesOf(s))+int(s.off) || int64(s.off)+s.size() > int64(len(c.blocks[s.block-1-c.first].buf)) {
			t.Fatalf("slot %d names bytes past its block", i)
		}
	}
	var arena int64
	for k, b := range c.blocks {
		arena += int64(cap(b.buf))
		if perBlock[uint32(k)] != b.live {
			t.Errorf("block %d counts %d live chunks, slots name %d", k, b.live, perBlock[uint32(k)])
		}
	}
	if live != c.live || held != c.held || arena != c.arena {
		t.Errorf("cache accounts %d entries, %d bytes, %d arena; slots hold %d, %d; blocks %d", c.live, c.held, c.arena, live, held, arena)
	}
	if c.live > c.maxEntries || c.arena > c.budget {
		t.Errorf("cache holds %d entries (max %d), %d arena bytes (budget %d)", c.live, c.maxEntries, c.arena, c.budget)
	}
}

// TestRemoteSendsWholeChat: the remote backend posts every field that
// shapes the prompt, so the engine renders what the client sent.
func TestRemoteSendsWholeChat(t *testing.T) {
	var got map[string]json.RawMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Error(err)
		}
		w.Write([]byte(`{"tokens":[1,2,3]}`))
	}))
	defer srv.Close()
	m := mustLoad(t, Config{Model: "m1", Backend: BackendRemote, URL: srv.URL, HTTPClient: srv.Client()})
	body := `{"model":"m1","messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],
		"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false,"continue_final_message":true}`
	b, err := ParseBody(PathChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.EncodeChat(b.Chat); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"messages":               `[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}]},{"role":"tool","content":"r","tool_call_id":"c"}]`,
		"tools":                  `[{"type":"function","function":{"name":"f"}}]`,
		"tool_choice":            `"auto"`,
		"chat_template_kwargs":   `{"enable_thinking":false}`,
		"add_generation_prompt":  `false`,
		"continue_final_message": `true`,
	}
	for k, v := range want {
		if string(got[k]) != v {
			t.Errorf("posted %s = %s, want %s", k, got[k], v)
		}
	}
}
