package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
	"github.com/google/go-cmp/cmp"
)

// The hand-written splitters must cut text exactly as the patterns they
// implement. regexp2 (a backtracking engine with look-ahead, and with the
// same \s, \p{L} and \p{N} classes) runs the patterns themselves here as
// the oracle. The Qwen pattern is also covered end to end by the
// JavaScript reference (reference_test.go).

var handWritten = map[string]splitter{
	"gpt2":   gpt2Splitter{},
	"cl100k": cl100kSplitter{maxDigits: 3},
	"qwen2":  cl100kSplitter{maxDigits: 1},
	"o200k":  o200kSplitter{},
}

var patterns = map[string]string{"gpt2": patGPT2, "cl100k": patCL100K, "qwen2": patQwen2, "o200k": patO200K}

func splitAll(s splitter, text string) []string {
	var out []string
	s.split(text, func(p string) { out = append(out, p) })
	return out
}

func oracle(t testing.TB, name string) splitter {
	re, err := regexp2.Compile(patterns[name], regexp2.Unicode)
	if err != nil {
		t.Fatal(err)
	}
	return &regexpSplitter{re: re}
}

func corpusTexts(t testing.TB) []string {
	data, err := os.ReadFile(filepath.Join("testdata", "reference", "corpus.json"))
	if err != nil {
		t.Fatal(err)
	}
	var corpus []struct{ Text string }
	if err := json.Unmarshal(data, &corpus); err != nil {
		t.Fatal(err)
	}
	texts := []string{"'s 'S 'Re 'LL 'x '", "HelloWorld camelCase XMLHttp ÀÉÎõ ǅungla e\u0301\u0301x \u0301a a\u0301B /path//x\n ok's", "ʰʰa \u02b0 Aʰ", "a\n\n b", " \n", "x  \t\n  y", "1234567", " !!\n\n", "\r\n\r\n", "  ", " a", "\ta", "'\u00e9"}
	for _, c := range corpus {
		texts = append(texts, c.Text)
	}
	return texts
}

func TestSplittersMatchPatterns(t *testing.T) {
	for name, s := range handWritten {
		re := oracle(t, name)
		for _, text := range corpusTexts(t) {
			want, got := splitAll(re, text), splitAll(s, text)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s: split(%.60q) differs from the pattern (-want +got):\n%s", name, text, diff)
			}
		}
	}
}

// The long s folds to s under (?i) in Oniguruma and JavaScript (the
// reference engines) but not in regexp2, so it is checked apart.
func TestContractionFolding(t *testing.T) {
	got := splitAll(cl100kSplitter{maxDigits: 3}, "it'ſ")
	if diff := cmp.Diff([]string{"it", "'ſ"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func FuzzSplit(f *testing.F) {
	for _, s := range corpusTexts(f) {
		if len(s) < 300 {
			f.Add(s)
		}
	}
	oracles := map[string]splitter{}
	for name := range handWritten {
		oracles[name] = oracle(f, name)
	}
	f.Fuzz(func(t *testing.T, text string) {
		text = sanitizeUTF8(text)
		if strings.ContainsRune(text, 0x17F) || len(text) > 1024 {
			return // see TestContractionFolding; keep the oracle fast
		}
		for name, s := range handWritten {
			got := splitAll(s, text)
			if strings.Join(got, "") != text {
				t.Fatalf("%s: pieces of %q do not add up: %q", name, text, got)
			}
			if want := splitAll(oracles[name], text); !cmp.Equal(want, got) {
				t.Fatalf("%s: split(%q) = %q, pattern gives %q", name, text, got, want)
			}
		}
	})
}

// TestClassTable: the table gives the class the unicode package does for
// every rune of the Basic Multilingual Plane.
func TestClassTable(t *testing.T) {
	for r := rune(0); r < 0x10000; r++ {
		if got, want := classOf(r), classOfSlow(r); got != want {
			t.Fatalf("classOf(%U) = %d, want %d", r, got, want)
		}
	}
}
