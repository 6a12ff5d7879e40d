package tokenizer

import (
	"testing"
)

func cl100k(t testing.TB) *hfTokenizer {
	t.Helper()
	return mustLoad(t, Config{Backend: BackendOpenAI, Encoding: "cl100k_base"}).tok.(*hfTokenizer)
}

// TestTablesHoldTheMaps: every key of the vocab and merge maps is found in
// its table with its value, for both embedded encodings and the small
// fixtures (whose tables have few slots).
func TestTablesHoldTheMaps(t *testing.T) {
	toks := map[string]*hfTokenizer{
		"cl100k":        cl100k(t),
		"o200k":         mustLoad(t, Config{Backend: BackendOpenAI, Encoding: "o200k_base"}).tok.(*hfTokenizer),
		"bytelevel":     loadTiny(t, tinyByteLevel(), "").tok.(*hfTokenizer),
		"sentencepiece": loadTiny(t, tinySentencePiece(), "").tok.(*hfTokenizer),
	}
	for name, tok := range toks {
		t.Run(name, func(t *testing.T) {
			for s, want := range tok.vocab {
				if got, ok := tok.vocabTab.get(s); !ok || got != want {
					t.Fatalf("vocabTab.get(%q) = %d, %v; want %d, true", s, got, ok, want)
				}
			}
			for k, want := range tok.model.merges {
				if got := tok.model.pairs.get(k); got != want {
					t.Fatalf("pairs.get(%#x) = %#x; want %#x", k, got, want)
				}
			}
		})
	}
}

func TestVocabTableEmptyKey(t *testing.T) {
	for _, vocab := range []map[string]uint32{{}, {"a": 1}, {"": 7, "a": 1}} {
		tab := newVocabTable(vocab)
		for _, s := range []string{"", "a", "b", "ab"} {
			want, wantOK := vocab[s]
			if got, ok := tab.get(s); got != want || ok != wantOK {
				t.Errorf("vocab %v: get(%q) = %d, %v; want %d, %v", vocab, s, got, ok, want, wantOK)
			}
		}
	}
}

// FuzzVocabTable: for any byte string, the table answers as the map.
func FuzzVocabTable(f *testing.F) {
	tok := cl100k(f)
	for _, s := range []string{"", " ", "the", " the", "\xff", "a\x00b", "   ", "\n\n", "ĠĠ", " supercalifragilistic", "<|endoftext|>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// The input, and its prefixes and suffixes: pieces of a text that
		// is mostly made of tokens.
		for i := 0; i <= len(s); i++ {
			for _, k := range []string{s[:i], s[i:]} {
				want, wantOK := tok.vocab[k]
				if got, ok := tok.vocabTab.get(k); got != want || ok != wantOK {
					t.Fatalf("vocabTab.get(%q) = %d, %v; map has %d, %v", k, got, ok, want, wantOK)
				}
			}
		}
	})
}

// FuzzPairTable: for any pair of ids, the table answers as the map.
func FuzzPairTable(f *testing.F) {
	tok := cl100k(f)
	for _, p := range [][2]uint32{{0, 0}, {1, 2}, {256, 257}, {100255, 100256}, {^uint32(0), ^uint32(0)}} {
		f.Add(p[0], p[1])
	}
	f.Fuzz(func(t *testing.T, a, b uint32) {
		want, ok := tok.model.merges[pairKey(a, b)]
		if !ok {
			want = freePair.val
		}
		if got := tok.model.pairs.get(pairKey(a, b)); got != want {
			t.Fatalf("pairs.get(%d, %d) = %#x; map has %#x, %v", a, b, got, want, ok)
		}
	})
}
