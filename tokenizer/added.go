package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is a token matched in the text before any normalization or
// pre-tokenization: special tokens (<|im_start|>, <s>) and the added tokens
// of tokenizer.json. Text never merges across one.
type addedToken struct {
	content    string
	id         uint32
	special    bool
	lstrip     bool // swallow the whitespace on its left
	rstrip     bool // swallow the whitespace on its right
	singleWord bool // match only when not inside a word
}

// addedMatcher finds added tokens leftmost-longest, as the aho-corasick
// automaton of the Hugging Face tokenizers does.
type addedMatcher struct {
	first  [256]bool
	byByte [256][]addedToken // by first byte, longest first
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &addedMatcher{}
	for _, t := range tokens {
		if t.content == "" {
			continue
		}
		b := t.content[0]
		m.first[b] = true
		m.byByte[b] = append(m.byByte[b], t)
	}
	for b := range m.byByte {
		sort.SliceStable(m.byByte[b], func(i, j int) bool {
			return len(m.byByte[b][i].content) > len(m.byByte[b][j].content)
		})
	}
	return m
}

// segment is a piece of text to encode, or an added token already known.
type segment struct {
	text    string
	id      uint32
	isToken bool
	// start is the byte offset of text in the string split; Metaspace's
	// "first" prepend scheme only applies at offset 0.
	start int
}

// split cuts s into text segments and added tokens, calling emit in order.
// Empty text segments are not emitted.
func (m *addedMatcher) split(s string, emit func(segment)) {
	if m == nil {
		if s != "" {
			emit(segment{text: s})
		}
		return
	}
	last := 0
	for i := 0; i < len(s); i++ {
		if !m.first[s[i]] {
			continue
		}
		t, ok := m.matchAt(s, i)
		if !ok {
			continue
		}
		start, end := i, i+len(t.content)
		if t.lstrip {
			for start > last {
				r, n := utf8.DecodeLastRuneInString(s[last:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= n
			}
		}
		if t.rstrip {
			for end < len(s) {
				r, n := utf8.DecodeRuneInString(s[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += n
			}
		}
		if start > last {
			emit(segment{text: s[last:start], start: last})
		}
		emit(segment{id: t.id, isToken: true, start: start})
		last = end
		i = end - 1
	}
	if last < len(s) {
		emit(segment{text: s[last:], start: last})
	}
}

func (m *addedMatcher) matchAt(s string, i int) (addedToken, bool) {
	for _, t := range m.byByte[s[i]] {
		if !strings.HasPrefix(s[i:], t.content) {
			continue
		}
		if t.singleWord && !isWordBoundary(s, i, i+len(t.content)) {
			continue
		}
		return t, true
	}
	return addedToken{}, false
}

func isWordBoundary(s string, start, end int) bool {
	isWord := func(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }
	if start > 0 {
		if r, _ := utf8.DecodeLastRuneInString(s[:start]); isWord(r) {
			return false
		}
	}
	if end < len(s) {
		if r, _ := utf8.DecodeRuneInString(s[end:]); isWord(r) {
			return false
		}
	}
	return true
}
