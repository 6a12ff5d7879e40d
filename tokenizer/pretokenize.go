package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The split patterns of GPT-2, cl100k_base / Llama-3 and Qwen2/Qwen3 use
// look-ahead (`\s+(?!\S)`), which Go's regexp cannot express. They are
// implemented by hand below, alternative by alternative, with the
// leftmost-first, greedy-with-backtracking semantics of the Oniguruma and
// fancy-regex engines that the reference implementations use. Any other
// pattern falls back to regexp2 (a backtracking engine), which is slower.
//
// Character classes follow Unicode as Go's unicode tables define it:
// \p{L} = unicode.IsLetter, \p{N} = unicode.IsNumber, \s = unicode.IsSpace
// (the White_Space property, as Oniguruma's \s).

const (
	// patGPT2 is GPT-2's pattern, also the ByteLevel pre-tokenizer's default.
	patGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// patCL100K is cl100k_base's pattern, used by Llama-3.
	patCL100K = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patQwen2 is the Qwen2 / Qwen3 pattern: cl100k's with single digits.
	patQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patO200K is o200k_base's pattern: words split at case changes.
	patO200K = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter cuts text into pieces that BPE encodes independently. split
// calls emit with consecutive, non-overlapping pieces covering the text.
type splitter interface {
	split(text string, emit func(piece string))
}

// pieceFinder is a splitter that finds its pieces one at a time: the piece
// of s at i ends at next(s, i), for i < len(s). The hand-written splitters
// are; split is the loop over next.
type pieceFinder interface {
	next(s string, i int) int
}

var (
	_ pieceFinder = gpt2Splitter{}
	_ pieceFinder = cl100kSplitter{}
	_ pieceFinder = o200kSplitter{}
)

// newSplitter returns the hand-written splitter for a known pattern, or a
// regexp2-backed one.
func newSplitter(pattern string) (splitter, error) {
	switch pattern {
	case patGPT2:
		return gpt2Splitter{}, nil
	case patCL100K:
		return cl100kSplitter{maxDigits: 3}, nil
	case patQwen2:
		return cl100kSplitter{maxDigits: 1}, nil
	case patO200K:
		return o200kSplitter{}, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("split pattern %q: %w", pattern, err)
	}
	return &regexpSplitter{re: re}, nil
}

// Character classes, looked up in a table for the Basic Multilingual Plane:
// the unicode package answers IsLetter by a binary search of its range
// tables, a large part of splitting text that is not ASCII.
const (
	clsOther = iota // [^\s\p{L}\p{N}]
	clsLetter
	clsNumber
	clsSpace
)

// bmpClass is classOfSlow of every rune below U+10000, filled from the
// range tables (a few tens of microseconds, where calling classOfSlow for
// each rune takes milliseconds). The classes are disjoint.
var bmpClass = func() *[0x10000]uint8 {
	t := new([0x10000]uint8)
	fill := func(rt *unicode.RangeTable, cls uint8) {
		for _, rg := range rt.R16 {
			for r := int(rg.Lo); r <= int(rg.Hi); r += int(rg.Stride) {
				t[r] = cls
			}
		}
		for _, rg := range rt.R32 {
			for r := int(rg.Lo); r <= int(rg.Hi) && r < len(t); r += int(rg.Stride) {
				t[r] = cls
			}
		}
	}
	fill(unicode.White_Space, clsSpace)
	fill(unicode.Number, clsNumber)
	fill(unicode.Letter, clsLetter)
	// Latin-1, which the unicode package answers from its own table.
	for r := rune(0); r < 0x100; r++ {
		t[r] = classOfSlow(r)
	}
	return t
}()

func classOf(r rune) uint8 {
	if uint32(r) < uint32(len(bmpClass)) {
		return bmpClass[r]
	}
	return classOfSlow(r)
}

func classOfSlow(r rune) uint8 {
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// runeAt decodes the rune at byte offset i; at the end it returns -1.
func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// runOf returns the end of the run of runes of class cls starting at i.
// numberRun ends \p{N}{1,max} whose first digit ends at j.
func numberRun(s string, j, max int) int {
	for k := 1; k < max; k++ {
		r2, n2 := runeAt(s, j)
		if r2 < 0 || classOf(r2) != clsNumber {
			break
		}
		j += n2
	}
	return j
}

// otherRun ends ` ?[^\s\p{L}\p{N}]+` followed by newlines (and slashes
// when slash) for the piece at i whose first rune r (of class cls) is n
// bytes long; -1 when the piece is not one.
func otherRun(s string, i, n int, r rune, cls uint8, slash bool) int {
	j := -1
	if cls == clsOther {
		j = runOf(s, i+n, clsOther)
	} else if r == ' ' {
		if r2, n2 := runeAt(s, i+n); r2 >= 0 && classOf(r2) == clsOther {
			j = runOf(s, i+n+n2, clsOther)
		}
	}
	if j < 0 {
		return -1
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || (slash && s[j] == '/')) {
		j++
	}
	return j
}

// lastNewline is the index of the last \r or \n in s[i:end], or -1.
func lastNewline(s string, i, end int) int {
	for k := end - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k
		}
	}
	return -1
}

func runOf(s string, i int, cls uint8) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if classOf(r) != cls {
			break
		}
		i += n
	}
	return i
}

// contraction returns the length of a contraction ('s 't 're 've 'm 'll 'd)
// at i, or 0. With fold, letters match case-insensitively, as (?i:...)
// does (including the long s, U+017F, which folds to s).
func contraction(s string, i int, fold bool) int {
	if i >= len(s) || s[i] != '\'' {
		return 0
	}
	lower := func(j int) (byte, int) {
		r, n := runeAt(s, j)
		if r < 0 {
			return 0, 0
		}
		if fold {
			if r == 0x17F {
				return 's', n
			}
			if r >= 'A' && r <= 'Z' {
				r += 'a' - 'A'
			}
		}
		if r >= utf8.RuneSelf {
			return 0, 0
		}
		return byte(r), n
	}
	c1, n1 := lower(i + 1)
	switch c1 {
	case 's', 't', 'm', 'd':
		return 1 + n1
	case 'r', 'v', 'l':
		want := byte('e')
		if c1 == 'l' {
			want = 'l'
		}
		if c2, n2 := lower(i + 1 + n1); c2 == want {
			return 1 + n1 + n2
		}
	}
	return 0
}

// spaceRun handles the whitespace alternatives shared by the patterns,
// `\s+(?!\S)|\s+`, at i where s[i] starts a whitespace run ending at j.
func spaceRun(s string, i, j int) int {
	if j >= len(s) {
		return j
	}
	// \s+(?!\S): give back the last whitespace rune so that the next
	// piece starts with it; \s+ takes a single rune otherwise.
	_, last := utf8.DecodeLastRuneInString(s[i:j])
	if j-last > i {
		return j - last
	}
	return j
}

type gpt2Splitter struct{}

func (g gpt2Splitter) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := g.next(s, i)
		emit(s[i:j])
		i = j
	}
}

func (gpt2Splitter) next(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	r, n := runeAt(s, i)
	start := i
	cls := classOf(r)
	if r == ' ' {
		// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
		if r2, n2 := runeAt(s, i+n); r2 >= 0 {
			if c2 := classOf(r2); c2 != clsSpace {
				return runOf(s, i+n+n2, c2)
			}
		}
	}
	if cls != clsSpace {
		return runOf(s, start+n, cls)
	}
	return spaceRun(s, i, runOf(s, i, clsSpace))
}

// cl100kSplitter implements patCL100K (maxDigits 3) and patQwen2 (1).
type cl100kSplitter struct{ maxDigits int }

func (c cl100kSplitter) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := c.next(s, i)
		emit(s[i:j])
		i = j
	}
}

func (c cl100kSplitter) next(s string, i int) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	r, n := runeAt(s, i)
	cls := classOf(r)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if cls == clsLetter {
		return runOf(s, i+n, clsLetter)
	}
	if cls != clsNumber && r != '\r' && r != '\n' {
		if r2, n2 := runeAt(s, i+n); r2 >= 0 && classOf(r2) == clsLetter {
			return runOf(s, i+n+n2, clsLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if cls == clsNumber {
		return numberRun(s, i+n, c.maxDigits)
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	if j := otherRun(s, i, n, r, cls, false); j >= 0 {
		return j
	}
	// Whitespace from here on.
	end := runOf(s, i, clsSpace)
	// \s*[\r\n]+: up to and including the run's last newline.
	if k := lastNewline(s, i, end); k >= 0 {
		return k + 1
	}
	return spaceRun(s, i, end)
}

// o200kSplitter implements patO200K.
type o200kSplitter struct{}

func (o o200kSplitter) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := o.next(s, i)
		emit(s[i:j])
		i = j
	}
}

// isUpperish is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], isLowerish
// [\p{Ll}\p{Lm}\p{Lo}\p{M}]; Lm, Lo and marks are in both.
func isUpperish(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= 'A' && r <= 'Z'
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

func isLowerish(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= 'a' && r <= 'z'
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

// runWhile returns the end of the run of runes satisfying f from i.
func runWhile(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !f(r) {
			break
		}
		i += n
	}
	return i
}

// o200kWord matches U*W+ (upperFirst false) or U+W* (true) at j, then an
// optional contraction; -1 if it does not match. U* backtracks until a W
// follows, as the regex engine does.
func o200kWord(s string, j int, upperFirst bool) int {
	uEnd := runWhile(s, j, isUpperish)
	if upperFirst {
		if uEnd == j {
			return -1
		}
		e := runWhile(s, uEnd, isLowerish)
		return e + contraction(s, e, true)
	}
	for k := uEnd; ; {
		if r, _ := runeAt(s, k); r >= 0 && isLowerish(r) {
			e := runWhile(s, k, isLowerish)
			return e + contraction(s, e, true)
		}
		if k == j {
			return -1
		}
		_, n := utf8.DecodeLastRuneInString(s[j:k])
		k -= n
	}
}

func (o200kSplitter) next(s string, i int) int {
	r, n := runeAt(s, i)
	cls := classOf(r)
	prefix := cls != clsLetter && cls != clsNumber && r != '\r' && r != '\n'
	for _, upperFirst := range []bool{false, true} {
		if prefix {
			if e := o200kWord(s, i+n, upperFirst); e >= 0 {
				return e
			}
		}
		if e := o200kWord(s, i, upperFirst); e >= 0 {
			return e
		}
	}
	// \p{N}{1,3}
	if cls == clsNumber {
		return numberRun(s, i+n, 3)
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
	if j := otherRun(s, i, n, r, cls, true); j >= 0 {
		return j
	}
	end := runOf(s, i, clsSpace)
	if k := lastNewline(s, i, end); k >= 0 {
		return k + 1
	}
	return spaceRun(s, i, end)
}

// regexpSplitter runs any other pattern with regexp2, keeping the gaps
// between matches as pieces (the Split pre-tokenizer's Isolated behaviour).
type regexpSplitter struct{ re *regexp2.Regexp }

func (r *regexpSplitter) split(s string, emit func(string)) {
	// regexp2 works on runes; map rune offsets back to bytes.
	runes := []rune(s)
	offsets := make([]int, len(runes)+1)
	b := 0
	for k, rr := range runes {
		offsets[k] = b
		b += utf8.RuneLen(rr)
	}
	offsets[len(runes)] = b
	last := 0
	m, err := r.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		start, end := offsets[m.Index], offsets[m.Index+m.Length]
		if start > last {
			emit(s[last:start])
		}
		if end > start {
			emit(s[start:end])
		}
		last = end
		m, err = r.re.FindNextMatch(m)
	}
	if last < len(s) {
		emit(s[last:])
	}
}
