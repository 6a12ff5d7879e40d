package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// mixedText is ~size bytes of the reference corpus (English, code, CJK,
// emoji, whitespace, numbers), cut at a rune boundary.
func mixedText(b *testing.B, size int) string {
	data, err := os.ReadFile(filepath.Join("testdata", "reference", "corpus.json"))
	if err != nil {
		b.Fatal(err)
	}
	var corpus []struct{ Text string }
	if err := json.Unmarshal(data, &corpus); err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	for sb.Len() < size {
		for _, c := range corpus {
			if len(c.Text) < 1000 { // skip the long single-character runs
				sb.WriteString(c.Text)
				sb.WriteString("\n")
			}
		}
	}
	s := sb.String()[:size]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

func benchEncode(b *testing.B, m Tokenizer) {
	text := mixedText(b, 10<<10)
	ids, err := m.Encode(text)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.Encode(text); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkEncode: 10 KB of mixed text, one goroutine.
func BenchmarkEncode(b *testing.B) {
	b.Run("bytelevel-qwen3", func(b *testing.B) {
		dir, _ := loadReference(b)
		benchEncode(b, referenceModel(b, dir, "qwen3"))
	})
	b.Run("sentencepiece-mistral", func(b *testing.B) {
		dir, _ := loadReference(b)
		benchEncode(b, referenceModel(b, dir, "llama2"))
	})
	b.Run("openai-cl100k", func(b *testing.B) {
		benchEncode(b, mustLoad(b, Config{Backend: BackendOpenAI, Encoding: "cl100k_base"}))
	})
	b.Run("openai-o200k", func(b *testing.B) {
		benchEncode(b, mustLoad(b, Config{Backend: BackendOpenAI, Encoding: "o200k_base"}))
	})
	b.Run("estimate", func(b *testing.B) {
		benchEncode(b, mustLoad(b, Config{Backend: BackendEstimate}))
	})
}

// BenchmarkChat20Turns replays a 20-turn conversation as a client sends
// it: 20 chat requests, each the previous one plus a turn. Each replay
// starts with an empty prefix cache. "encode" tokenizes the rendered
// texts (what the cache saves); "render+encode" is EncodeChat, which also
// renders the Jinja template every time.
func BenchmarkChat20Turns(b *testing.B) {
	dir, _ := loadReference(b)
	path := filepath.Join(dir, "models", "qwen3")
	msgs := benchConversation(b)
	m := mustLoad(b, Config{Model: "qwen3", Backend: BackendHuggingFace, Path: path, CacheSize: -1})
	seg := m.tok.(segmenter)
	var texts []string
	for turn := 2; turn <= len(msgs); turn++ {
		text, err := m.RenderChat(&ChatRequest{Messages: msgs[:turn], AddGenerationPrompt: true})
		if err != nil {
			b.Fatal(err)
		}
		texts = append(texts, text)
	}
	for _, cached := range []bool{false, true} {
		name := map[bool]string{false: "uncached", true: "cached"}[cached]
		b.Run("encode/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				c := newChatCache(4096)
				for _, text := range texts {
					if cached {
						c.encode(seg, text)
					} else {
						ids := make([]uint32, 0, len(text)/3)
						seg.segments(text, func(s segment) { ids = seg.appendSegment(ids, s) })
					}
				}
			}
		})
		b.Run("render+encode/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				m.cache = nil
				if cached {
					m.cache = newChatCache(4096)
				}
				for turn := 2; turn <= len(msgs); turn++ {
					if _, err := m.EncodeChat(&ChatRequest{Messages: msgs[:turn], AddGenerationPrompt: true}); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// benchConversation is a system prompt and 10 rounds of a ~400-byte user
// message and a ~1.2 KB assistant answer (21 messages, ~16 KB rendered),
// cut from the mixed corpus text.
func benchConversation(b *testing.B) []Message {
	text := mixedText(b, 40<<10)
	cut := func(off, n int) string {
		s := text[off : off+n]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		return s
	}
	msgs := []Message{{Role: "system", Content: "You are a helpful assistant. Answer with code where it helps."}}
	off := 0
	for i := 0; i < 10; i++ {
		msgs = append(msgs, Message{Role: "user", Content: cut(off, 400)})
		msgs = append(msgs, Message{Role: "assistant", Content: cut(off+400, 1200)})
		off += 1600
	}
	return msgs
}

// BenchmarkEncodeChat8KB is the chat of one ext_proc decision with the
// default tokenizer (cl100k_base, ChatML): a system prompt and three
// rounds of user and assistant messages, ~8 KB rendered, through
// EncodeChat (render + tokenize) with no prefix cache, so every call
// tokenizes the whole chat as a new conversation does.
func BenchmarkEncodeChat8KB(b *testing.B) {
	m := mustLoad(b, Config{Backend: BackendOpenAI, Encoding: "cl100k_base", CacheSize: -1})
	text := mixedText(b, 8<<10)
	cut := func(s string, n int) (string, string) {
		for !utf8.ValidString(s[:n]) {
			n--
		}
		return s[:n], s[n:]
	}
	req := &ChatRequest{Messages: []Message{{Role: "system", Content: "You are a helpful assistant. Answer with code where it helps."}}, AddGenerationPrompt: true}
	for i := 0; i < 3; i++ {
		var u, a string
		u, text = cut(text, 700)
		a, text = cut(text, 1900)
		req.Messages = append(req.Messages, Message{Role: "user", Content: u}, Message{Role: "assistant", Content: a})
	}
	req.Messages = append(req.Messages, Message{Role: "user", Content: text})
	rendered, err := m.RenderChat(req)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := m.EncodeChat(req)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(rendered)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.EncodeChat(req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
