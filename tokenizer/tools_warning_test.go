package tokenizer

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// TestToolsUnrenderedWarnsOnce: a chat with tools encoded under a chat
// template that does not render them (cl100k_base's ChatML) logs one
// warning for the model, not one per request; a chat without tools none.
func TestToolsUnrenderedWarnsOnce(t *testing.T) {
	var logs bytes.Buffer
	m, err := Load(Config{Model: "m", Backend: BackendOpenAI, Encoding: "cl100k_base", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if m.RendersTools() {
		t.Fatal("ChatML renders tools?")
	}
	plain := NewChat(Message{Role: "user", Content: "hi"})
	if _, err := m.EncodeChat(plain); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "tools") {
		t.Fatalf("a chat without tools warned: %s", logs.String())
	}
	withTools := NewChat(Message{Role: "user", Content: "hi"})
	withTools.Tools = json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
	for range 3 {
		if _, err := m.EncodeChat(withTools); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "does not render tools"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
}
