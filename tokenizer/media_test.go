package tokenizer

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseBodyCacheSalt(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		want             string
		wantErr          bool
	}{
		{"chat", PathChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":"tenant-a"}`, "tenant-a", false},
		{"completions", PathCompletions, `{"model":"m","prompt":"hi","cache_salt":"s"}`, "s", false},
		{"completions ids", PathCompletions, `{"model":"m","prompt":[1,2],"cache_salt":"s"}`, "s", false},
		{"responses", PathResponses, `{"model":"m","input":"hi","cache_salt":"s"}`, "s", false},
		{"absent", PathChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "", false},
		{"null", PathChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":null}`, "", false},
		// vLLM's Anthropic request has no cache_salt: the engine ignores it.
		{"anthropic ignored", PathMessages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"cache_salt":"s"}`, "", false},
		{"empty", PathChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":""}`, "", true},
		{"number", PathCompletions, `{"model":"m","prompt":"hi","cache_salt":3}`, "", true},
		// SGLang's protocol admits a list; its OpenAI server refuses a
		// non-empty one and ignores an empty one (salt.go): refused.
		{"list", PathChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":["a","b"]}`, "", true},
		{"empty list", PathCompletions, `{"model":"m","prompt":"hi","cache_salt":[]}`, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ParseBody(tc.path, []byte(tc.body))
			if tc.wantErr {
				var be *BodyError
				if !errors.As(err, &be) || be.Reason != ReasonBadField || !strings.Contains(be.Msg, "cache_salt") || strings.HasPrefix(tc.name, "list") && !strings.Contains(be.Msg, "not a list") {
					t.Fatalf("ParseBody = %v, want a bad_field error naming cache_salt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.CacheSalt != tc.want {
				t.Errorf("CacheSalt = %q, want %q", b.CacheSalt, tc.want)
			}
		})
	}
}

// TestParseBodyExtraKey: SGLang's extra_key, which SGLang appends to
// cache_salt, is read where cache_salt is; Python-falsy values are none.
func TestParseBodyExtraKey(t *testing.T) {
	for _, tc := range []struct{ field, want string }{
		{`"extra_key":"k"`, "k"}, {`"extra_key":""`, ""}, {`"extra_key":[]`, ""}, {`"extra_key":null`, ""},
		{`"extra_key":0`, ""}, {`"extra_key":false`, ""}, {`"extra_key":["k"]`, `["k"]`}, {`"extra_key":1`, "1"},
	} {
		b, err := ParseBody(PathCompletions, []byte(`{"model":"m","prompt":"hi",`+tc.field+`}`))
		if err != nil {
			t.Fatalf("%s: %v", tc.field, err)
		}
		if b.ExtraKey != tc.want {
			t.Errorf("%s: ExtraKey = %q, want %q", tc.field, b.ExtraKey, tc.want)
		}
	}
}

// imageChat is a chat whose user turn shows an image (by URL) and asks
// about it, after a system prompt long enough to fill blocks.
func imageChat(t *testing.T, url, extra string) *ChatRequest {
	t.Helper()
	body := `{"model":"m","messages":[
		{"role":"system","content":"You are a careful assistant who describes pictures in plain words, one short paragraph at a time."},
		{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + url + `"}},{"type":"text","text":"What is in this picture?` + extra + `"}]}]}`
	b, err := ParseBody(PathChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return b.Chat
}

// withImageToken is the tiny byte-level model with <image> as an added
// token, as vision models' tokenizers have their placeholder.
func withImageToken() map[string]any {
	f := tinyByteLevel()
	added := f["added_tokens"].([]map[string]any)
	next := added[len(added)-1]["id"].(int) + 1
	f["added_tokens"] = append(added, map[string]any{"id": next, "content": DefaultImagePlaceholder, "special": true})
	return f
}

func TestEncodeChatMediaSpans(t *testing.T) {
	models := localModels(t)
	models["bytelevel+image"] = loadTiny(t, withImageToken(), chatMLTemplate)
	delete(models, "sentencepiece") // no chat template
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			a, b := imageChat(t, "https://x/a.png", ""), imageChat(t, "https://x/b.png", "")
			idsA, spansA, err := m.EncodeChatMedia(a)
			if err != nil {
				t.Fatal(err)
			}
			idsB, spansB, err := m.EncodeChatMedia(b)
			if err != nil {
				t.Fatal(err)
			}
			// The ids are EncodeChat's: the router hashes what the engine computes.
			plain, err := m.EncodeChat(a)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(plain, idsA); diff != "" {
				t.Fatalf("EncodeChatMedia ids differ from EncodeChat's (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(idsA, idsB); diff != "" {
				t.Fatalf("the images' placeholder tokens differ (-a +b):\n%s", diff)
			}
			if len(spansA) != 1 || len(spansB) != 1 {
				t.Fatalf("spans = %v, %v; want one each", spansA, spansB)
			}
			sa, sb := spansA[0], spansB[0]
			if sa.Hash != a.MMHashes[0] || sb.Hash != b.MMHashes[0] || sa.Hash == sb.Hash {
				t.Errorf("span hashes %q, %q; want the parts' %q, %q", sa.Hash, sb.Hash, a.MMHashes[0], b.MMHashes[0])
			}
			if sa.Offset != sb.Offset || sa.Length != sb.Length {
				t.Errorf("same text, spans %+v and %+v", sa, sb)
			}
			if sa.Offset <= 0 || sa.Length <= 0 || sa.Offset+sa.Length > len(idsA) {
				t.Fatalf("span %+v out of %d ids (or at the start: the system prompt comes first)", sa, len(idsA))
			}
			if m.approximate {
				return // 4-byte chunks: the span covers the placeholder's chunks
			}
			run, _ := m.Decode(idsA[sa.Offset : sa.Offset+sa.Length])
			before, _ := m.Decode(idsA[:sa.Offset])
			if !strings.Contains(run, DefaultImagePlaceholder) || strings.Contains(before, DefaultImagePlaceholder) {
				t.Errorf("span %+v decodes to %q after %q, want the placeholder's run", sa, run, before)
			}
			if name == "bytelevel+image" && (sa.Length != 1 || run != DefaultImagePlaceholder) {
				t.Errorf("added-token placeholder: span %+v = %q, want exactly the token", sa, run)
			}
		})
	}
}

// TestEncodeChatMediaFallback: when the placeholders found are not one per
// media part (a text part writes "<image>" too), every part spans from the
// first placeholder to the end: the text before still matches, and
// different media never do.
func TestEncodeChatMediaFallback(t *testing.T) {
	m := mustLoad(t, Config{Backend: BackendOpenAI, Encoding: "cl100k_base"})
	c := imageChat(t, "https://x/a.png", " It looks like <image> again.")
	ids, spans, err := m.EncodeChatMedia(c)
	if err != nil {
		t.Fatal(err)
	}
	_, exactSpans, err := m.EncodeChatMedia(imageChat(t, "https://x/a.png", ""))
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) != 1 || spans[0].Offset != exactSpans[0].Offset || spans[0].Offset+spans[0].Length != len(ids) {
		t.Errorf("spans = %+v of %d ids, want one from %d to the end", spans, len(ids), exactSpans[0].Offset)
	}
}

func TestMediaHashOrderAndUUID(t *testing.T) {
	// A client-named item is keyed by its uuid, as vLLM keys it.
	b, err := ParseBody(PathChat, []byte(`{"model":"m","messages":[{"role":"user","content":[
		{"type":"image_url","image_url":{"url":"https://x/a.png"},"uuid":"img-aaaa"},{"type":"image_url","image_url":{"url":"https://x/b.png"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Chat.MMHashes) != 2 || b.Chat.MMHashes[0] != "img-aaaa" || len(b.Chat.MMHashes[1]) != 64 {
		t.Errorf("MMHashes = %q, want the uuid, then a SHA-256", b.Chat.MMHashes)
	}
	// Anthropic: a tool result's image is rendered (as a tool message)
	// before the image of the message that carries the result.
	b, err = ParseBody(PathMessages, []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[
		{"type":"image","source":{"type":"url","url":"https://x/own.png"}},
		{"type":"tool_result","tool_use_id":"t1","content":[{"type":"image","source":{"type":"url","url":"https://x/tool.png"}}]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.Chat.Messages); n != 2 || b.Chat.Messages[0].Role != "tool" {
		t.Fatalf("messages = %+v, want the tool result first", b.Chat.Messages)
	}
	own, _ := ParseBody(PathMessages, []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/own.png"}}]}]}`))
	if len(b.Chat.MMHashes) != 2 || b.Chat.MMHashes[1] != own.Chat.MMHashes[0] {
		t.Errorf("MMHashes = %q, want the tool result's image, then the message's own (%q)", b.Chat.MMHashes, own.Chat.MMHashes)
	}
}
