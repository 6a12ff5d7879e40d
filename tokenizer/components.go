package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The tokenizer.json components this package implements. Anything else is
// a load-time error wrapping ErrUnsupported, never a silent difference.

type component struct {
	Type string `json:"type"`
}

type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// eachInSequence calls f for each element of a "Sequence" component's list
// (the field key of raw), naming the failing element in the error.
func eachInSequence(raw json.RawMessage, key string, f func(json.RawMessage) error) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	var items []json.RawMessage
	if v, ok := fields[key]; ok && !rawJSONIsNull(v) {
		if err := json.Unmarshal(v, &items); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	for i, r := range items {
		if err := f(r); err != nil {
			return fmt.Errorf("%s[%d]: %w", key, i, err)
		}
	}
	return nil
}

// sequenceOf parses a "Sequence" component whose elements each parse to
// a list, and concatenates the lists.
func sequenceOf[T any](raw json.RawMessage, key string, parse func(json.RawMessage) ([]T, error)) ([]T, error) {
	var out []T
	err := eachInSequence(raw, key, func(r json.RawMessage) error {
		x, err := parse(r)
		out = append(out, x...)
		return err
	})
	return out, err
}

// normalizer rewrites a segment of text before pre-tokenization.
type normalizer func(string) string

func parseNormalizer(raw json.RawMessage) ([]normalizer, error) {
	if rawJSONIsNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		return sequenceOf(raw, "normalizers", parseNormalizer)
	case "NFC":
		return []normalizer{normForm(norm.NFC)}, nil
	case "NFD":
		return []normalizer{normForm(norm.NFD)}, nil
	case "NFKC":
		return []normalizer{normForm(norm.NFKC)}, nil
	case "NFKD":
		return []normalizer{normForm(norm.NFKD)}, nil
	case "Lowercase":
		return []normalizer{strings.ToLower}, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		return []normalizer{func(s string) string {
			if s == "" {
				return s
			}
			return p.Prepend + s
		}}, nil
	case "Replace":
		var p struct {
			Pattern pattern `json:"pattern"`
			Content string  `json:"content"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		if p.Pattern.String == nil {
			return nil, fmt.Errorf("normalizer or decoder Replace with a regex pattern: %w", ErrUnsupported)
		}
		from := *p.Pattern.String
		return []normalizer{func(s string) string { return strings.ReplaceAll(s, from, p.Content) }}, nil
	}
	return nil, fmt.Errorf("type %q: %w", c.Type, ErrUnsupported)
}

func normForm(f norm.Form) normalizer {
	return func(s string) string {
		if f.IsNormalString(s) {
			return s
		}
		return f.String(s)
	}
}

// preStep is one pre-tokenizer: it cuts a piece into smaller pieces.
// first is true for the piece that starts the whole input.
type preStep interface {
	apply(piece string, first bool, emit func(string))
}

func runPre(steps []preStep, piece string, first bool, emit func(string)) {
	switch len(steps) {
	case 0:
		emit(piece)
	case 1:
		steps[0].apply(piece, first, emit)
	default:
		steps[0].apply(piece, first, func(p string) { runPre(steps[1:], p, first, emit) })
	}
}

type splitStep struct{ s splitter }

// onlyPieceFinder returns the splitter of a pre-tokenizer that is a single
// split step, when it finds its pieces one at a time; otherwise nil.
func onlyPieceFinder(steps []preStep) pieceFinder {
	if len(steps) != 1 {
		return nil
	}
	st, ok := steps[0].(splitStep)
	if !ok {
		return nil
	}
	pf, _ := st.s.(pieceFinder)
	return pf
}

func (st splitStep) apply(piece string, _ bool, emit func(string)) { st.s.split(piece, emit) }

// prefixSpaceStep is ByteLevel's add_prefix_space.
type prefixSpaceStep struct{}

func (prefixSpaceStep) apply(piece string, _ bool, emit func(string)) {
	if !strings.HasPrefix(piece, " ") {
		piece = " " + piece
	}
	emit(piece)
}

// metaspaceStep replaces spaces with ▁ (or the configured rune), prepends
// one per the prepend scheme, and optionally splits before each ▁.
type metaspaceStep struct {
	replacement string
	scheme      string // always, first, never
	split       bool
}

func (m metaspaceStep) apply(piece string, first bool, emit func(string)) {
	piece = strings.ReplaceAll(piece, " ", m.replacement)
	if (m.scheme == "always" || (m.scheme == "first" && first)) && !strings.HasPrefix(piece, m.replacement) {
		piece = m.replacement + piece
	}
	if !m.split {
		emit(piece)
		return
	}
	start := 0
	for i := len(m.replacement); i < len(piece); {
		j := strings.Index(piece[i:], m.replacement)
		if j < 0 {
			break
		}
		emit(piece[start : i+j])
		start = i + j
		i = start + len(m.replacement)
	}
	emit(piece[start:])
}

// parsePreTokenizer returns the steps and whether the model is byte-level.
func parsePreTokenizer(raw json.RawMessage) ([]preStep, bool, error) {
	if rawJSONIsNull(raw) {
		return nil, false, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, false, err
	}
	switch c.Type {
	case "Sequence":
		var steps []preStep
		byteLevel := false
		err := eachInSequence(raw, "pretokenizers", func(r json.RawMessage) error {
			st, bl, err := parsePreTokenizer(r)
			steps = append(steps, st...)
			byteLevel = byteLevel || bl
			return err
		})
		return steps, byteLevel, err
	case "Split":
		var s struct {
			Pattern  pattern `json:"pattern"`
			Behavior string  `json:"behavior"`
			Invert   bool    `json:"invert"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, err
		}
		if s.Behavior != "Isolated" || s.Invert {
			return nil, false, fmt.Errorf("pre-tokenizer Split behavior %q invert=%v: %w (only Isolated)", s.Behavior, s.Invert, ErrUnsupported)
		}
		var sp splitter
		switch {
		case s.Pattern.Regex != nil:
			var err error
			if sp, err = newSplitter(*s.Pattern.Regex); err != nil {
				return nil, false, err
			}
		case s.Pattern.String != nil:
			sp, _ = newSplitter(regexpQuote(*s.Pattern.String))
		default:
			return nil, false, fmt.Errorf("pre-tokenizer Split without a pattern")
		}
		return []preStep{splitStep{sp}}, false, nil
	case "ByteLevel":
		var b struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, false, err
		}
		var steps []preStep
		if b.AddPrefixSpace {
			steps = append(steps, prefixSpaceStep{})
		}
		if b.UseRegex == nil || *b.UseRegex {
			steps = append(steps, splitStep{gpt2Splitter{}})
		}
		return steps, true, nil
	case "Metaspace":
		var m struct {
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			Split          *bool   `json:"split"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, false, err
		}
		st := metaspaceStep{replacement: m.Replacement, scheme: "always", split: m.Split == nil || *m.Split}
		if st.replacement == "" {
			st.replacement = "▁"
		}
		if m.PrependScheme != nil {
			st.scheme = *m.PrependScheme
		} else if m.AddPrefixSpace != nil && !*m.AddPrefixSpace {
			st.scheme = "never"
		}
		return []preStep{st}, false, nil
	}
	return nil, false, fmt.Errorf("type %q: %w", c.Type, ErrUnsupported)
}

func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$#&-~ `, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// parsePostProcessor returns the special-token ids added before and after
// a single sequence.
func parsePostProcessor(raw json.RawMessage, tokenID func(string) (uint32, bool)) (prefix, suffix []uint32, err error) {
	if rawJSONIsNull(raw) {
		return nil, nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "Sequence":
		err := eachInSequence(raw, "processors", func(r json.RawMessage) error {
			p, q, err := parsePostProcessor(r, tokenID)
			prefix = append(prefix, p...)
			suffix = append(q, suffix...)
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		var tp struct {
			Single []struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			} `json:"single"`
			SpecialTokens map[string]struct {
				IDs []uint32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(raw, &tp); err != nil {
			return nil, nil, err
		}
		seen := false
		for i, piece := range tp.Single {
			switch {
			case piece.Sequence != nil:
				if seen {
					return nil, nil, fmt.Errorf("single[%d]: the sequence twice: %w", i, ErrUnsupported)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := tp.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("single[%d]: special token %q not in special_tokens", i, piece.SpecialToken.ID)
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			}
		}
		return prefix, suffix, nil
	case "RobertaProcessing", "BertProcessing":
		var bp struct {
			Cls [2]json.RawMessage `json:"cls"`
			Sep [2]json.RawMessage `json:"sep"`
		}
		if err := json.Unmarshal(raw, &bp); err != nil {
			return nil, nil, err
		}
		var cls, sep uint32
		if err := json.Unmarshal(bp.Cls[1], &cls); err != nil {
			return nil, nil, fmt.Errorf("cls: %w", err)
		}
		if err := json.Unmarshal(bp.Sep[1], &sep); err != nil {
			return nil, nil, fmt.Errorf("sep: %w", err)
		}
		return []uint32{cls}, []uint32{sep}, nil
	}
	return nil, nil, fmt.Errorf("type %q: %w", c.Type, ErrUnsupported)
}

// decoder is one step of the decoder chain over token strings, as in the
// Hugging Face tokenizers.
type decoder func([]string) []string

func parseDecoder(raw json.RawMessage) ([]decoder, error) {
	if rawJSONIsNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		return sequenceOf(raw, "decoders", parseDecoder)
	case "ByteLevel":
		return []decoder{decodeByteLevel}, nil
	case "ByteFallback":
		return []decoder{decodeByteFallback}, nil
	case "Fuse":
		return []decoder{func(t []string) []string { return []string{strings.Join(t, "")} }}, nil
	case "Replace":
		var p struct {
			Pattern pattern `json:"pattern"`
			Content string  `json:"content"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		if p.Pattern.String == nil {
			return nil, fmt.Errorf("normalizer or decoder Replace with a regex pattern: %w", ErrUnsupported)
		}
		from := *p.Pattern.String
		return []decoder{func(t []string) []string {
			for i := range t {
				t[i] = strings.ReplaceAll(t[i], from, p.Content)
			}
			return t
		}}, nil
	case "Strip":
		var p struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		return []decoder{func(t []string) []string {
			for i := range t {
				s := t[i]
				for k := 0; k < p.Start && strings.HasPrefix(s, p.Content) && p.Content != ""; k++ {
					s = s[len(p.Content):]
				}
				for k := 0; k < p.Stop && strings.HasSuffix(s, p.Content) && p.Content != ""; k++ {
					s = s[:len(s)-len(p.Content)]
				}
				t[i] = s
			}
			return t
		}}, nil
	case "Metaspace":
		var m struct {
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		rep := m.Replacement
		if rep == "" {
			rep = "▁"
		}
		strip := !(m.PrependScheme != nil && *m.PrependScheme == "never") && !(m.AddPrefixSpace != nil && !*m.AddPrefixSpace)
		return []decoder{func(t []string) []string {
			for i := range t {
				s := strings.ReplaceAll(t[i], rep, " ")
				if i == 0 && strip {
					s = strings.TrimPrefix(s, " ")
				}
				t[i] = s
			}
			return t
		}}, nil
	}
	return nil, fmt.Errorf("type %q: %w", c.Type, ErrUnsupported)
}

func decodeByteLevel(toks []string) []string {
	var out []byte
	for _, t := range toks {
		if b, ok := byteLevelDecode(t); ok {
			out = append(out, b...)
		} else {
			out = append(out, t...)
		}
	}
	return []string{strings.ToValidUTF8(string(out), "\uFFFD")}
}

// decodeByteFallback turns runs of <0xXX> tokens into the text they spell,
// or one U+FFFD per byte when that is not valid UTF-8.
func decodeByteFallback(toks []string) []string {
	out := make([]string, 0, len(toks))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			out = append(out, strings.Repeat("\uFFFD", len(pending)))
		}
		pending = pending[:0]
	}
	for _, t := range toks {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if b, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				pending = append(pending, byte(b))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}
