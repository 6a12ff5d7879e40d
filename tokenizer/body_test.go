package tokenizer

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fastjson"
)

func TestParseBodyForms(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		want             *ChatRequest
	}{
		{"chat whole", PathChat, `{"model":"m","messages":[
			{"role":"system","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},
			{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}],"reasoning_content":"r"},
			{"role":"tool","tool_call_id":"c1","content":"ok","name":"f"}],
			"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","chat_template_kwargs":{"enable_thinking":false}}`,
			&ChatRequest{Messages: []Message{
				{Role: "system", Content: "<image>\na\nb"},
				{Role: "assistant", NullContent: true, ToolCalls: []ToolCall{{ID: "c1", Type: "function", Function: FunctionCall{Name: "f", Arguments: []byte(`{"x":1}`)}}}, ReasoningContent: "r"},
				{Role: "tool", ToolCallID: "c1", Content: "ok", Name: "f"}},
				Tools: []byte(`[{"type":"function","function":{"name":"f"}}]`), ToolChoice: []byte(`"auto"`), TemplateKwargs: []byte(`{"enable_thinking":false}`),
				AddGenerationPrompt: true, MMHashes: []string{"5c1b0b5a7de2c5d4e7a7f6e1bb7c8b8f3c3f6b6c1d2e3f4a5b6c7d8e9f0a1b2c"}}},
		{"continue", PathChat, `{"model":"m","messages":[{"role":"assistant","content":"he"}],"continue_final_message":true}`,
			&ChatRequest{Messages: []Message{{Role: "assistant", Content: "he"}}, ContinueFinalMessage: true}},
		{"responses", PathResponses, `{"model":"m","instructions":"be nice","input":[
			{"role":"user","content":[{"type":"input_text","text":"hi"}]},
			{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
			{"type":"function_call_output","call_id":"c1","output":"42"}],
			"tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object"}},{"type":"web_search"}]}`,
			&ChatRequest{Messages: []Message{{Role: "system", Content: "be nice"}, {Role: "user", Content: "hi"},
				{Role: "assistant", NullContent: true, ToolCalls: []ToolCall{{ID: "c1", Type: "function", Function: FunctionCall{Name: "f", Arguments: []byte(`{}`)}}}},
				{Role: "tool", ToolCallID: "c1", Content: "42"}},
				Tools: []byte(`[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}]`), AddGenerationPrompt: true}},
		{"responses string", PathResponses, `{"model":"m","input":"hello"}`,
			&ChatRequest{Messages: []Message{{Role: "user", Content: "hello"}}, AddGenerationPrompt: true}},
		{"anthropic", PathMessages, `{"model":"m","system":[{"type":"text","text":"sys"}],"max_tokens":5,"messages":[
			{"role":"user","content":"q"},
			{"role":"assistant","content":[{"type":"text","text":"let me see"},{"type":"tool_use","id":"t1","name":"f","input":{"a":[1,2]}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r"}]},{"type":"text","text":"and?"}]}],
			"tools":[{"name":"f","input_schema":{"type":"object"}}]}`,
			&ChatRequest{Messages: []Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "q"},
				{Role: "assistant", Content: "let me see", ToolCalls: []ToolCall{{ID: "t1", Type: "function", Function: FunctionCall{Name: "f", Arguments: []byte(`{"a":[1,2]}`)}}}},
				{Role: "tool", ToolCallID: "t1", Content: "r"}, {Role: "user", Content: "and?"}},
				Tools: []byte(`[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`), AddGenerationPrompt: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ParseBody(tc.path, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if len(tc.want.MMHashes) > 0 {
				if len(b.Chat.MMHashes) != len(tc.want.MMHashes) || len(b.Chat.MMHashes[0]) != 64 {
					t.Fatalf("MMHashes = %q", b.Chat.MMHashes)
				}
				tc.want.MMHashes = b.Chat.MMHashes
			}
			if diff := cmp.Diff(tc.want, b.Chat); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseBodyErrors(t *testing.T) {
	for _, tc := range []struct{ path, body, reason string }{
		{PathChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}}`, ReasonBadField},
		{PathChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]}`, ReasonBadField},
		{PathChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, ReasonBadField},
		{PathChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":"function"}]}]}`, ReasonBadField},
		{PathResponses, `{"model":"m"}`, ReasonMissingField},
		{PathResponses, `{"model":"m","input":[]}`, ReasonBadField},
		{PathMessages, `{"model":"m","messages":[{"role":"user"}]}`, ReasonBadField},
		{PathMessages, `{"model":"m","system":"s"}`, ReasonMissingField},
	} {
		_, err := ParseBody(tc.path, []byte(tc.body))
		var be *BodyError
		if !errors.As(err, &be) || be.Reason != tc.reason {
			t.Errorf("ParseBody(%s, %s) = %v, want reason %s", tc.path, tc.body, err, tc.reason)
		}
	}
}

// TestMessageJSON: Message's JSON forms round-trip (null content kept).
func TestMessageJSON(t *testing.T) {
	in := `{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"k\":\"v\"}"}}]}`
	var m Message
	if err := json.Unmarshal([]byte(in), &m); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":{"k":"v"}}}]}`; string(out) != want {
		t.Errorf("Marshal = %s, want %s", out, want)
	}
}

func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"x"}`, `{"model":"m","prompt":[1,2]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"é"},{"type":"image_url","image_url":{"url":"u"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1.50}"}}]}],"chat_template_kwargs":{"enable_thinking":true}}`,
		`{"model":"m","input":[{"type":"function_call","name":"f","arguments":"x"},{"type":"function_call_output","output":"y"}],"instructions":"i"}`,
		`{"model":"m","system":"s","messages":[{"role":"user","content":[{"type":"tool_result","content":"r"},{"type":"image","source":{}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"},"uuid":"id"},{"type":"text","text":"<image> <audio"}]}],"cache_salt":"s"}`,
		`{"model":"m","prompt":"x","cache_salt":""}`,
		`{}`, `[`, ``,
	} {
		for _, p := range []string{PathChat, PathCompletions, PathResponses, PathMessages, "/x"} {
			f.Add(p, []byte(s))
		}
	}
	m, err := Load(Config{Model: "m", Backend: BackendOpenAI})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		b, err := ParseBody(path, body)
		if err != nil {
			var be *BodyError
			if !errors.As(err, &be) || be.Reason == "" || be.Msg == "" {
				t.Fatalf("error %v is not a complete BodyError", err)
			}
			return
		}
		forms := 0
		if b.Prompt != "" {
			forms++
		}
		if b.PromptTokens != nil {
			forms++
		}
		if b.Chat != nil {
			forms++
			if len(b.Chat.Messages) == 0 {
				t.Fatal("chat without messages")
			}
			for _, raw := range [][]byte{b.Chat.Tools, b.Chat.ToolChoice, b.Chat.TemplateKwargs} {
				if raw != nil && !json.Valid(raw) {
					t.Fatalf("invalid raw JSON %q", raw)
				}
			}
			_, _ = m.EncodeChat(b.Chat) // a template error is fine; a panic is not
			// Media spans: one per part, inside the ids.
			if ids, spans, err := m.EncodeChatMedia(b.Chat); err == nil {
				if len(spans) != len(b.Chat.MMHashes) {
					t.Fatalf("%d spans for %d media parts", len(spans), len(b.Chat.MMHashes))
				}
				for _, sp := range spans {
					if sp.Offset < 0 || sp.Length < 0 || sp.Offset+sp.Length > len(ids) {
						t.Fatalf("span %+v out of %d ids", sp, len(ids))
					}
				}
			}
		}
		if b.CacheSalt != "" && path == PathMessages {
			t.Fatalf("Anthropic body salted %q", b.CacheSalt)
		}
		if forms != 1 || b.Model == "" {
			t.Fatalf("accepted %q with %d forms, model %q", body, forms, b.Model)
		}
	})
}

// FuzzMessageJSON: Message's UnmarshalJSON (ParseBody's message reader)
// never panics, and what it accepts survives a Marshal round trip.
func FuzzMessageJSON(f *testing.F) {
	for _, s := range []string{
		`{"role":"user","content":"x"}`, `{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}`,
		`{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"a"},{"type":"input_audio"}]}`, `{"content":3}`, `[]`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m Message
		if json.Unmarshal(data, &m) != nil {
			return
		}
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", m, err)
		}
		var back Message
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("Unmarshal(Marshal) %s: %v", out, err)
		}
		// Marshal escapes HTML characters in the raw arguments (\u0026):
		// the same JSON value.
		for _, msg := range []*Message{&m, &back} {
			for i := range msg.ToolCalls {
				var sb strings.Builder
				o := pyJSONOpts{itemSep: ",", keySep: ":", indent: -1}
				if err := o.writeRaw(&sb, fastjson.MustParseBytes(msg.ToolCalls[i].Function.Arguments), 0); err != nil {
					t.Fatal(err)
				}
				msg.ToolCalls[i].Function.Arguments = []byte(sb.String())
			}
		}
		if diff := cmp.Diff(m, back); diff != "" {
			t.Fatalf("round trip of %s (-first +second):\n%s", out, diff)
		}
	})
}
