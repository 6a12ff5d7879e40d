package up

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tokenizer"
)

// TestTokenizerRendersTools: the mock model's template renders a chat's
// tools and its assistant's tool calls (Qwen3's template: tokenizer/
// builtin_test.go checks it against the reference renderer), so the
// router's tokens for a chat with tools differ from the same chat without
// them, as an engine's do.
func TestTokenizerRendersTools(t *testing.T) {
	tok, err := loadTokenizer("mock", nil)
	if err != nil {
		t.Fatal(err)
	}
	const withTools = `{"model":"mock","messages":[
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"18C"}],
		"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`
	body, err := tokenizer.ParseBody(tokenizer.PathChat, []byte(withTools))
	if err != nil {
		t.Fatal(err)
	}
	text, err := tok.RenderChat(body.Chat)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<tools>", `"description": "Current weather"`, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "<tool_response>\n18C\n</tool_response>"} {
		if !strings.Contains(text, want) {
			t.Errorf("rendered chat lacks %q:\n%s", want, text)
		}
	}
	ids, err := tok.EncodeChat(body.Chat)
	if err != nil {
		t.Fatal(err)
	}
	body.Chat.Tools = nil
	plain, err := tok.EncodeChat(body.Chat)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(ids, plain) {
		t.Error("a chat's tools do not change its tokens")
	}
}
