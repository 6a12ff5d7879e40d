package tokenizer

import (
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// tiktoken-go is a second, independent implementation of the OpenAI
// encodings (regexp2 for the split patterns, its own merge loop): the
// openai backend must agree with it, as it must with js-tiktoken in the
// reference test.

var setLoader sync.Once

func tiktokenGo(t testing.TB, encoding string) *tiktoken.Tiktoken {
	setLoader.Do(func() { tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader()) })
	enc, err := tiktoken.GetEncoding(encoding)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

func tiktokenIDs(enc *tiktoken.Tiktoken, text string) []uint32 {
	ids := []uint32{}
	for _, id := range enc.Encode(sanitizeUTF8(text), []string{"all"}, nil) {
		ids = append(ids, uint32(id))
	}
	return ids
}

func TestOpenAIMatchesTiktokenGo(t *testing.T) {
	texts := append(corpusTexts(t), strings.Repeat("Hello, World! Ça va? 12345 ", 500), "a\xffb")
	for _, encoding := range []string{"cl100k_base", "o200k_base"} {
		m := mustLoad(t, Config{Backend: BackendOpenAI, Encoding: encoding})
		enc := tiktokenGo(t, encoding)
		for _, text := range texts {
			got, _ := m.Encode(text)
			if diff := cmp.Diff(tiktokenIDs(enc, text), got); diff != "" {
				t.Errorf("%s: Encode(%.60q) differs from tiktoken-go (-want +got):\n%s", encoding, text, diff)
			}
		}
	}
}
