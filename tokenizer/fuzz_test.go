package tokenizer

import (
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

var (
	fuzzOnce   sync.Once
	fuzzModels map[string]*Model
)

// FuzzEncode: no input makes a tokenizer panic or fail, and for valid
// UTF-8, Decode(Encode(x)) gives x back (less the BOS the model adds).
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", " ", "hello world", "a\xffb", "<|im_start|>user\nhi<|im_end|>", "<s>[INST] x [/INST]",
		"  \n\n\t x", "I'M DON'T 'll", "1234567", "敏捷的狐狸 🦊👨‍👩‍👧", "e\u0301 \u00a0\u2028", strings.Repeat("ab ", 100)} {
		f.Add(s)
	}
	fuzzOnce.Do(func() { fuzzModels = localModels(f) })
	f.Fuzz(func(t *testing.T, text string) {
		for name, m := range fuzzModels {
			ids, err := m.Encode(text)
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", name, text, err)
			}
			if !utf8.ValidString(text) {
				continue
			}
			if h, ok := m.tok.(*hfTokenizer); ok {
				ids = ids[len(h.prefix) : len(ids)-len(h.suffix)]
			}
			if name == "sentencepiece" && (strings.Contains(text, "▁") || strings.Contains(text, "<s>") || strings.Contains(text, "</s>") || strings.Contains(text, "<unk>")) {
				continue // ▁ reads back as a space; added tokens get a ▁ after them
			}
			got, err := m.Decode(ids)
			if err != nil {
				t.Fatalf("%s: Decode(Encode(%q)): %v", name, text, err)
			}
			if got != text {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", name, text, got)
			}
		}
	})
}
