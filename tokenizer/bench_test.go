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
// it: 20 chat requests, each the previous one plus a turn, rendered and
// tokenized. "cached" starts each replay with an empty prefix cache.
func BenchmarkChat20Turns(b *testing.B) {
	dir, _ := loadReference(b)
	path := filepath.Join(dir, "models", "qwen3")
	msgs := conversation(10) // system + 10 × (user, assistant) = 21 messages
	for _, tc := range []struct {
		name  string
		cache int
	}{{"uncached", -1}, {"cached", 4096}} {
		b.Run(tc.name, func(b *testing.B) {
			m := mustLoad(b, Config{Model: "qwen3", Backend: BackendHuggingFace, Path: path, CacheSize: tc.cache})
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if tc.cache > 0 {
					m.cache = newChatCache(tc.cache)
				}
				for turn := 2; turn <= len(msgs); turn++ {
					if _, err := m.EncodeChat(msgs[:turn], true); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
