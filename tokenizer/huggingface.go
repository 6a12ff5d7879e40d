package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// hfTokenizer is a Hugging Face tokenizer.json with a BPE model: byte-level
// (GPT-2, Llama-3, Qwen) or SentencePiece-style (Llama-2, Mistral: ▁ for
// spaces, byte fallback).
type hfTokenizer struct {
	name      string
	added     *addedMatcher // raw-text added tokens (normalized: false)
	addedNorm *addedMatcher // added tokens matched after normalization
	normalize []normalizer
	pre       []preStep
	// nextPiece, when not nil, is the whole pre-tokenizer: a split pattern
	// that finds its pieces one at a time, so encoding loops over them
	// without a callback per piece (see appendPieces).
	nextPiece  pieceFinder
	byteLevel  bool // vocab keys are raw bytes (ByteLevel pre-tokenizer)
	vocab      map[string]uint32
	vocabTab   *vocabTable // vocab for the per-piece lookups of encoding
	byteIDs    [256]uint32 // byte-level: the id of each single byte
	byteFB     [256]uint32 // SentencePiece byte fallback: <0xXX> ids
	hasByteFB  bool
	unk        uint32
	hasUnk     bool
	fuseUnk    bool
	ignoreMrg  bool
	model      bpe
	prefix     []uint32 // post-processor tokens before the sequence
	suffix     []uint32 // and after it
	idToToken  []string // id → token string as in the file
	addedByID  map[uint32]string
	specialIDs map[uint32]bool
	decoders   []decoder
	// newlineSafe: the pre-tokenizer always cuts text before a '<' that
	// follows a newline, so segments may be cut there (see segmenter).
	newlineSafe bool
	// slowSplit: a split pattern that is not hand-written runs on regexp2,
	// slower and not checked against the reference.
	slowSplit bool
}

var _ segmenter = (*hfTokenizer)(nil)

func (t *hfTokenizer) segments(text string, emit func(segment)) {
	t.added.split(text, func(s segment) {
		if s.isToken || !t.newlineSafe {
			emit(s)
			return
		}
		splitNewlineMarker(s, emit)
	})
}

var _ Tokenizer = (*hfTokenizer)(nil)

// ErrUnsupported is wrapped by load errors for tokenizer.json components
// (normalizers, pre-tokenizers, models, ...) that this package does not
// implement.
var ErrUnsupported = errors.New("unsupported")

type hfFile struct {
	AddedTokens []struct {
		ID         uint32 `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		Lstrip     bool   `json:"lstrip"`
		Rstrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
}

type hfModel struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Dropout                 *float64          `json:"dropout"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
}

// loadHuggingFace reads a tokenizer.json. Every error names the file and
// the part of it that is wrong.
func loadHuggingFace(path, name string) (*hfTokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parseHuggingFace(data, name)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return t, nil
}

func parseHuggingFace(data []byte, name string) (*hfTokenizer, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	if len(f.Model) == 0 || string(f.Model) == "null" {
		return nil, errors.New("no model")
	}
	var m hfModel
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if m.Type != "BPE" && !(m.Type == "" && m.Merges != nil) {
		return nil, fmt.Errorf("model type %q: %w (only BPE)", m.Type, ErrUnsupported)
	}
	if len(m.Vocab) == 0 {
		return nil, errors.New("model.vocab is empty")
	}
	if m.Dropout != nil && *m.Dropout > 0 {
		return nil, fmt.Errorf("model.dropout %v: %w", *m.Dropout, ErrUnsupported)
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") || (m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, fmt.Errorf("model.continuing_subword_prefix / end_of_word_suffix: %w", ErrUnsupported)
	}
	var err error
	t := &hfTokenizer{name: name, fuseUnk: m.FuseUnk, ignoreMrg: m.IgnoreMerges, addedByID: map[uint32]string{}, specialIDs: map[uint32]bool{}}

	if t.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.pre, t.byteLevel, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	t.newlineSafe = newlineSafe(f.Normalizer, t.pre)
	t.nextPiece = onlyPieceFinder(t.pre)
	for _, p := range t.pre {
		if st, ok := p.(splitStep); ok {
			if _, ok := st.s.(*regexpSplitter); ok {
				t.slowSplit = true
			}
		}
	}

	// Ids: the vocab plus the added tokens.
	maxID := uint32(0)
	for _, id := range m.Vocab {
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		maxID = max(maxID, a.ID)
	}
	if maxID > 1<<26 {
		return nil, fmt.Errorf("token id %d is implausibly large", maxID)
	}
	t.idToToken = make([]string, maxID+1)
	t.vocab = make(map[string]uint32, len(m.Vocab))
	for tok, id := range m.Vocab {
		t.idToToken[id] = tok
		key := tok
		if t.byteLevel {
			if b, ok := byteLevelDecode(tok); ok {
				key = string(b)
			}
		}
		t.vocab[key] = id
	}
	t.vocabTab = newVocabTable(t.vocab)
	if m.UnkToken != nil && *m.UnkToken != "" {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in the vocab", *m.UnkToken)
		}
		t.unk, t.hasUnk = id, true
	}
	if t.byteLevel {
		for b := 0; b < 256; b++ {
			id, ok := t.vocab[string([]byte{byte(b)})]
			if !ok {
				return nil, fmt.Errorf("byte-level vocab lacks byte 0x%02X (%q)", b, byteToRune[b])
			}
			t.byteIDs[b] = id
		}
	}
	if m.ByteFallback {
		t.hasByteFB = true
		for b := 0; b < 256; b++ {
			id, ok := m.Vocab[fmt.Sprintf("<0x%02X>", b)]
			if !ok {
				t.hasByteFB = false
				break
			}
			t.byteFB[b] = id
		}
	}

	if err := t.parseMerges(m.Merges, m.Vocab); err != nil {
		return nil, err
	}

	var raw, norm []addedToken
	for i, a := range f.AddedTokens {
		if a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d] has no content", i)
		}
		t.idToToken[a.ID] = a.Content
		t.addedByID[a.ID] = a.Content
		if a.Special {
			t.specialIDs[a.ID] = true
		}
		at := addedToken{content: a.Content, id: a.ID, special: a.Special, lstrip: a.Lstrip, rstrip: a.Rstrip, singleWord: a.SingleWord}
		if a.Normalized && !a.Special {
			norm = append(norm, at)
		} else {
			raw = append(raw, at)
		}
	}
	t.added = newAddedMatcher(raw)
	t.addedNorm = newAddedMatcher(norm)

	tokenID := func(s string) (uint32, bool) {
		if id, ok := m.Vocab[s]; ok {
			return id, true
		}
		for _, a := range f.AddedTokens {
			if a.Content == s {
				return a.ID, true
			}
		}
		return 0, false
	}
	if t.prefix, t.suffix, err = parsePostProcessor(f.PostProcessor, tokenID); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	if t.decoders, err = parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	return t, nil
}

func (t *hfTokenizer) parseMerges(raw json.RawMessage, vocab map[string]uint32) error {
	var pairs [][2]string
	if len(raw) > 0 && string(raw) != "null" {
		// Older files: ["a b", ...]; newer: [["a", "b"], ...].
		var asStrings []string
		if err := json.Unmarshal(raw, &asStrings); err == nil {
			pairs = make([][2]string, len(asStrings))
			for i, s := range asStrings {
				a, b, ok := strings.Cut(s, " ")
				if !ok || strings.Contains(b, " ") {
					return fmt.Errorf("model.merges[%d]: %q is not two tokens separated by a space", i, s)
				}
				pairs[i] = [2]string{a, b}
			}
		} else if err := json.Unmarshal(raw, &pairs); err != nil {
			return fmt.Errorf("model.merges: neither a list of \"a b\" strings nor of [a, b] pairs: %w", err)
		}
	}
	t.model.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		c, okC := vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return fmt.Errorf("model.merges[%d]: %q %q: token missing from the vocab", rank, p[0], p[1])
		}
		k := pairKey(a, b)
		if _, dup := t.model.merges[k]; !dup {
			t.model.merges[k] = uint64(rank)<<32 | uint64(c)
		}
	}
	t.model.pairs = newPairTable(t.model.merges)
	return nil
}

func (t *hfTokenizer) Name() string { return t.name }

// Encode tokenizes text as the Hugging Face tokenizer does with
// add_special_tokens=true: added tokens in the text are recognised, and the
// post-processor's tokens (BOS) are added.
func (t *hfTokenizer) Encode(text string) ([]uint32, error) {
	ids := make([]uint32, 0, len(text)/3+len(t.prefix)+len(t.suffix)+1)
	ids = append(ids, t.prefix...)
	ids = t.appendText(ids, text)
	return append(ids, t.suffix...), nil
}

// appendText encodes text without post-processor tokens.
func (t *hfTokenizer) appendText(ids []uint32, text string) []uint32 {
	text = sanitizeUTF8(text)
	t.added.split(text, func(s segment) {
		ids = t.appendSegment(ids, s)
	})
	return ids
}

func (t *hfTokenizer) appendSegment(ids []uint32, s segment) []uint32 {
	if s.isToken {
		return append(ids, s.id)
	}
	text := s.text
	for _, n := range t.normalize {
		text = n(text)
	}
	first := s.start == 0
	t.addedNorm.split(text, func(ns segment) {
		if ns.isToken {
			ids = append(ids, ns.id)
			return
		}
		ids = t.appendPieces(ids, ns.text, first && ns.start == 0)
	})
	return ids
}

// appendPieces pre-tokenizes text and encodes its pieces.
func (t *hfTokenizer) appendPieces(ids []uint32, text string, first bool) []uint32 {
	if t.nextPiece == nil {
		return t.appendPre(ids, text, first)
	}
	for i := 0; i < len(text); {
		j := t.nextPiece.next(text, i)
		ids = t.appendPiece(ids, text[i:j])
		i = j
	}
	return ids
}

// appendPre is appendPieces for any pre-tokenizer. It is apart because its
// callback would otherwise move ids to the heap on every call.
func (t *hfTokenizer) appendPre(ids []uint32, text string, first bool) []uint32 {
	runPre(t.pre, text, first, func(piece string) {
		ids = t.appendPiece(ids, piece)
	})
	return ids
}

func (t *hfTokenizer) appendPiece(ids []uint32, piece string) []uint32 {
	if piece == "" {
		return ids
	}
	if t.ignoreMrg {
		if id, ok := t.vocabTab.get(piece); ok {
			return append(ids, id)
		}
	}
	start := len(ids)
	if t.byteLevel {
		for i := 0; i < len(piece); i++ {
			ids = append(ids, t.byteIDs[piece[i]])
		}
	} else {
		unkRun := false
		for i := 0; i < len(piece); {
			_, n := utf8.DecodeRuneInString(piece[i:])
			if id, ok := t.vocabTab.get(piece[i : i+n]); ok {
				ids = append(ids, id)
				unkRun = false
			} else if t.hasByteFB {
				for k := i; k < i+n; k++ {
					ids = append(ids, t.byteFB[piece[k]])
				}
				unkRun = false
			} else if t.hasUnk {
				if !(t.fuseUnk && unkRun) {
					ids = append(ids, t.unk)
				}
				unkRun = true
			}
			i += n
		}
	}
	merged := t.model.merge(ids[start:])
	return ids[:start+len(merged)]
}

// Decode turns ids back into text through the file's decoder, keeping
// special tokens (skip_special_tokens=false). Invalid UTF-8 produced by
// byte tokens becomes U+FFFD.
func (t *hfTokenizer) Decode(ids []uint32) (string, error) {
	toks := make([]string, len(ids))
	for i, id := range ids {
		if int(id) >= len(t.idToToken) || t.idToToken[id] == "" {
			return "", fmt.Errorf("%w: %d", ErrUnknownID, id)
		}
		toks[i] = t.idToToken[id]
	}
	for _, d := range t.decoders {
		toks = d(toks)
	}
	return strings.ToValidUTF8(strings.Join(toks, ""), "\uFFFD"), nil
}

// ByteLevel: the GPT-2 mapping of bytes to printable runes.
var byteToRune, runeToByte = func() (b2r [256]rune, r2b map[rune]byte) {
	r2b = map[rune]byte{}
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// byteLevelDecode maps a byte-level token string back to bytes; ok is false
// if a rune is outside the mapping.
func byteLevelDecode(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := runeToByte[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}

// rawJSONIsNull reports whether a component is absent.
func rawJSONIsNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// newlineSafe reports whether cutting text before "\n<" leaves its
// encoding unchanged: the first pre-tokenizer is one of the hand-written
// patterns (each ends a piece at a newline before '<'), no later step adds
// text, and the normalizers work rune by rune.
func newlineSafe(normRaw json.RawMessage, pre []preStep) bool {
	if len(pre) == 0 {
		return false
	}
	st, ok := pre[0].(splitStep)
	if !ok {
		return false
	}
	switch st.s.(type) {
	case gpt2Splitter, cl100kSplitter:
	default:
		return false
	}
	for _, p := range pre[1:] {
		if _, ok := p.(splitStep); !ok {
			return false
		}
	}
	var walk func(raw json.RawMessage) bool
	walk = func(raw json.RawMessage) bool {
		if rawJSONIsNull(raw) {
			return true
		}
		var c struct {
			Type        string            `json:"type"`
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if json.Unmarshal(raw, &c) != nil {
			return false
		}
		switch c.Type {
		case "NFC", "NFD", "NFKC", "NFKD", "Lowercase":
			return true
		case "Sequence":
			for _, n := range c.Normalizers {
				if !walk(n) {
					return false
				}
			}
			return true
		}
		return false
	}
	return walk(normRaw)
}
