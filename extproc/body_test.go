package extproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/tokenizer"
)

// chatMessages is req's conversation (nil for a completion).
func chatMessages(req *globalrouter.Request) []tokenizer.Message {
	if req.Chat == nil {
		return nil
	}
	return req.Chat.Messages
}

func TestParseBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		path   string
		body   string
		want   globalrouter.Request
		stream bool
		reason string // non-empty: the bodyError reason expected
	}{
		{name: "completion string", path: completionsPath, body: `{"model":"m","prompt":"héllo"}`,
			want: globalrouter.Request{Model: "m", Prompt: "héllo"}},
		{name: "completion tokens", path: completionsPath, body: `{"model":"m","prompt":[1,2,4294967295],"stream":true}`,
			want: globalrouter.Request{Model: "m", PromptTokens: []uint32{1, 2, 4294967295}}, stream: true},
		{name: "completion one-element string list", path: completionsPath, body: `{"model":"m","prompt":["a b"]}`,
			want: globalrouter.Request{Model: "m", Prompt: "a b"}},
		{name: "completion one-element token list", path: completionsPath, body: `{"model":"m","prompt":[[5,6]]}`,
			want: globalrouter.Request{Model: "m", PromptTokens: []uint32{5, 6}}},
		{name: "chat string and parts", path: chatPath, body: `{"model":"m","messages":[
			{"role":"system","content":"s"},
			{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},
			{"role":"assistant","content":null,"tool_calls":[]}]}`,
			want: globalrouter.Request{Model: "m", Chat: &tokenizer.ChatRequest{Messages: []tokenizer.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "<image>\na\nb"}, {Role: "assistant", NullContent: true}},
				AddGenerationPrompt: true, MMHashes: []string{"2efaefebe93350e3ef11183812b55308549d72d45e3821f39225d3db000b144f"}}}},
		{name: "custom path with messages", path: "/v2/chat", body: `{"model":"m","messages":[{"role":"user","content":"x"}]}`,
			want: globalrouter.Request{Model: "m", Chat: tokenizer.NewChat(tokenizer.Message{Role: "user", Content: "x"})}},
		{name: "custom path with prompt", path: "/v2/gen", body: `{"model":"m","prompt":"x"}`,
			want: globalrouter.Request{Model: "m", Prompt: "x"}},
		// A lone surrogate escape stays as written: it only affects routing
		// (the engine gets the original body).
		{name: "escapes and lone surrogate", path: completionsPath, body: `{"model":"m","prompt":"a\n\u00e9\"\ud800"}`,
			want: globalrouter.Request{Model: "m", Prompt: "a\né\"\\ud800"}},
		{name: "unknown fields kept out", path: completionsPath, body: `{"model":"m","prompt":"x","max_tokens":5,"extra":{"a":[1]}}`,
			want: globalrouter.Request{Model: "m", Prompt: "x"}},
		{name: "not json", path: completionsPath, body: `model=m`, reason: reasonBadJSON},
		{name: "truncated", path: completionsPath, body: `{"model":"m","prompt":"x`, reason: reasonBadJSON},
		{name: "two values", path: completionsPath, body: `{"model":"m","prompt":"x"}{}`, reason: reasonBadJSON},
		{name: "array body", path: completionsPath, body: `[1]`, reason: reasonBadJSON},
		{name: "model wrong type", path: completionsPath, body: `{"model":1,"prompt":"x"}`, reason: reasonBadField},
		{name: "stream wrong type", path: completionsPath, body: `{"model":"m","prompt":"x","stream":"yes"}`, reason: reasonBadField},
		{name: "bad escape", path: completionsPath, body: `{"model":"m","prompt":"\x"}`, reason: reasonBadJSON},
		{name: "message not an object", path: chatPath, body: `{"model":"m","messages":["hi"]}`, reason: reasonBadField},
		{name: "part text not a string", path: chatPath, body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, reason: reasonBadField},
		{name: "no model", path: completionsPath, body: `{"prompt":"x"}`, reason: reasonMissingField},
		{name: "no prompt", path: completionsPath, body: `{"model":"m","messages":[{"role":"user","content":"x"}]}`, reason: reasonMissingField},
		{name: "null prompt", path: completionsPath, body: `{"model":"m","prompt":null}`, reason: reasonMissingField},
		{name: "no messages", path: chatPath, body: `{"model":"m","prompt":"x"}`, reason: reasonMissingField},
		{name: "custom path neither", path: "/v2/x", body: `{"model":"m"}`, reason: reasonMissingField},
		{name: "empty prompt", path: completionsPath, body: `{"model":"m","prompt":""}`, reason: reasonBadField},
		{name: "empty token list", path: completionsPath, body: `{"model":"m","prompt":[]}`, reason: reasonBadField},
		{name: "batch", path: completionsPath, body: `{"model":"m","prompt":[[1],[2]]}`, reason: reasonBadField},
		{name: "token overflow", path: completionsPath, body: `{"model":"m","prompt":[4294967296]}`, reason: reasonBadField},
		{name: "token float", path: completionsPath, body: `{"model":"m","prompt":[1.5]}`, reason: reasonBadField},
		{name: "prompt object", path: completionsPath, body: `{"model":"m","prompt":{}}`, reason: reasonBadField},
		{name: "empty messages", path: chatPath, body: `{"model":"m","messages":[]}`, reason: reasonBadField},
		{name: "content number", path: chatPath, body: `{"model":"m","messages":[{"role":"user","content":3}]}`, reason: reasonBadField},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got globalrouter.Request
			pb, err := parseBody(tc.path, []byte(tc.body), &got, tokenizer.DuplicatesRefuse)
			if tc.reason != "" {
				var be *bodyError
				if !errors.As(err, &be) || be.reason != tc.reason {
					t.Fatalf("error %v, want a bodyError with reason %q", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if pb.stream != tc.stream {
				t.Errorf("stream %v, want %v", pb.stream, tc.stream)
			}
		})
	}
}

// FuzzParseBody: any input either fails with a bodyError or yields a model
// and exactly one prompt form; strings come out valid UTF-8; and the
// parser agrees with encoding/json on what is JSON.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"x"}`, `{"model":"m","prompt":[1,2]}`, `{"model":"m","prompt":[[1]]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"é"}]}]}`,
		`{"model":"m","prompt":["\ud800"]}`, `{}`, `[`, ``, `null`,
	} {
		f.Add(completionsPath, []byte(s))
		f.Add(chatPath, []byte(s))
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		var req globalrouter.Request
		_, err := parseBody(path, body, &req, tokenizer.DuplicatesRefuse)
		valid := json.Valid(body)
		if err != nil {
			var be *bodyError
			if !errors.As(err, &be) || be.reason == "" || be.msg == "" {
				t.Fatalf("error %v is not a complete bodyError", err)
			}
			if !valid && be.reason != reasonBadJSON {
				t.Fatalf("invalid JSON %q refused with reason %q, want %q", body, be.reason, reasonBadJSON)
			}
			if valid && be.reason == reasonBadJSON && bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
				t.Fatalf("valid JSON object %q refused as bad JSON: %v", body, err)
			}
			return
		}
		if req.Model == "" {
			t.Fatal("accepted without a model")
		}
		forms := 0
		if req.Prompt != "" {
			forms++
		}
		if len(req.PromptTokens) > 0 {
			forms++
		}
		if req.Chat != nil && len(req.Chat.Messages) > 0 {
			forms++
		}
		if forms != 1 {
			t.Fatalf("%d prompt forms set, want 1: %+v", forms, req)
		}
		if !valid {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if !utf8.ValidString(req.Model) || !utf8.ValidString(req.Prompt) {
			t.Fatalf("model %q or prompt %q is not valid UTF-8", req.Model, req.Prompt)
		}
		for _, m := range chatMessages(&req) {
			if !utf8.ValidString(m.Role) || !utf8.ValidString(m.Content) {
				t.Fatalf("message %+v is not valid UTF-8", m)
			}
		}
	})
}

func BenchmarkParseBody(b *testing.B) {
	var sb strings.Builder
	for i := 0; sb.Len() < 7800; i++ {
		fmt.Fprintf(&sb, "Paragraph %d: a router that knows which worker holds a prompt's prefix saves its prefill. ", i)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": []map[string]string{
		{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": sb.String()}}})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var req globalrouter.Request
		if _, err := parseBody(chatPath, body, &req, tokenizer.DuplicatesRefuse); err != nil {
			b.Fatal(err)
		}
	}
}
