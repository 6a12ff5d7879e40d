package tokenizer

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// openAI is an embedded OpenAI encoding (cl100k_base, o200k_base), through
// tiktoken-go with the offline loader: nothing is downloaded.
type openAI struct {
	name  string
	enc   *tiktoken.Tiktoken
	added *addedMatcher
	// decode is the byte string of each id, specials included.
	decode [][]byte
}

var (
	_ Tokenizer = (*openAI)(nil)
	_ segmenter = (*openAI)(nil)
)

func (t *openAI) segments(text string, emit func(segment)) {
	t.added.split(text, func(s segment) {
		if s.isToken {
			emit(s)
			return
		}
		splitNewlineMarker(s, emit)
	})
}

// openAIEncodings are the encodings offered; the special tokens are
// tiktoken's.
var openAIEncodings = map[string]map[string]uint32{
	"cl100k_base": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
	"o200k_base":  {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
}

var setOfflineLoader sync.Once

func loadOpenAI(encoding string) (*openAI, error) {
	specials, ok := openAIEncodings[encoding]
	if !ok {
		names := make([]string, 0, len(openAIEncodings))
		for n := range openAIEncodings {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("%w: unknown openai encoding %q (have %s)", ErrConfig, encoding, strings.Join(names, ", "))
	}
	// tiktoken-go keeps its loader in a package variable; the offline one
	// reads the encodings embedded by tiktoken-go-loader.
	setOfflineLoader.Do(func() { tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader()) })
	enc, err := tiktoken.GetEncoding(encoding)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: encoding %s: %w", encoding, err)
	}
	ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe(encoding + ".tiktoken")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: encoding %s: %w", encoding, err)
	}
	t := &openAI{name: encoding, enc: enc}
	size := 0
	for _, id := range specials {
		size = max(size, int(id)+1)
	}
	for _, r := range ranks {
		size = max(size, r+1)
	}
	t.decode = make([][]byte, size)
	for tok, r := range ranks {
		t.decode[r] = []byte(tok)
	}
	var added []addedToken
	for s, id := range specials {
		t.decode[id] = []byte(s)
		added = append(added, addedToken{content: s, id: id, special: true})
	}
	t.added = newAddedMatcher(added)
	return t, nil
}

func (t *openAI) Name() string { return t.name }

// Encode encodes text with every special token allowed, as
// tiktoken's encode(text, allowed_special="all").
func (t *openAI) Encode(text string) ([]uint32, error) {
	return t.appendText(make([]uint32, 0, len(text)/3+1), text), nil
}

func (t *openAI) appendText(ids []uint32, text string) []uint32 {
	t.added.split(sanitizeUTF8(text), func(s segment) { ids = t.appendSegment(ids, s) })
	return ids
}

func (t *openAI) appendSegment(ids []uint32, s segment) []uint32 {
	if s.isToken {
		return append(ids, s.id)
	}
	for _, id := range t.enc.EncodeOrdinary(s.text) {
		ids = append(ids, uint32(id))
	}
	return ids
}

func (t *openAI) Decode(ids []uint32) (string, error) {
	var b []byte
	for _, id := range ids {
		if int(id) >= len(t.decode) || t.decode[id] == nil {
			return "", fmt.Errorf("%w: %d", ErrUnknownID, id)
		}
		b = append(b, t.decode[id]...)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}
