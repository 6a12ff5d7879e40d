package tokenizer

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// openAIEncodings are the encodings offered; the special tokens are
// tiktoken's.
var openAIEncodings = map[string]map[string]uint32{
	"cl100k_base": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
	"o200k_base":  {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
}

// loadOpenAI returns an embedded OpenAI encoding. The ranks come from
// tiktoken-go-loader (embedded files: nothing is downloaded); encoding runs
// on this package's byte-level BPE with the hand-written split patterns.
// openai_test.go checks it against tiktoken-go and the reference checks it
// against js-tiktoken.
//
// Each encoding is built once per process and shared by every Load: a
// process that loads it several times (kvgate up's routers and mock
// workers, the tests' many systems, seconds each under the race detector)
// builds it once. The encoding is read-only once built (routers and mock
// workers already share one Model), so sharing it changes no result; the
// process keeps each encoding it loaded, one per name.
func loadOpenAI(encoding string) (*hfTokenizer, error) {
	if _, ok := openAIEncodings[encoding]; !ok {
		return buildOpenAI(encoding) // its error; nothing kept for an unknown name
	}
	f, _ := sharedOpenAI.LoadOrStore(encoding, sync.OnceValues(func() (*hfTokenizer, error) { return buildOpenAI(encoding) }))
	return f.(func() (*hfTokenizer, error))()
}

// sharedOpenAI holds the process's built encodings (loadOpenAI):
// encoding name → its sync.OnceValues builder.
var sharedOpenAI sync.Map

func buildOpenAI(encoding string) (*hfTokenizer, error) {
	specials, ok := openAIEncodings[encoding]
	if !ok {
		names := make([]string, 0, len(openAIEncodings))
		for n := range openAIEncodings {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("%w: unknown openai encoding %q (have %s)", ErrConfig, encoding, strings.Join(names, ", "))
	}
	ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe(encoding + ".tiktoken")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: encoding %s: %w", encoding, err)
	}
	sp := splitter(cl100kSplitter{maxDigits: 3})
	if encoding == "o200k_base" {
		sp = o200kSplitter{}
	}
	return rankedBPE(encoding, ranks, specials, sp), nil
}

// rankedBPE builds a tiktoken encoding on this package's byte-level BPE.
// tiktoken merges, lowest rank first and leftmost on ties, the adjacent
// pair whose concatenation has the lowest rank, and takes a piece that is
// a token whole; with a merge for every split of every token into two
// tokens, and ignore_merges, the BPE here does the same.
func rankedBPE(name string, ranks map[string]int, specials map[string]uint32, sp splitter) *hfTokenizer {
	size := 0
	for _, r := range ranks {
		size = max(size, r+1)
	}
	for _, id := range specials {
		size = max(size, int(id)+1)
	}
	t := &hfTokenizer{
		name:        name,
		byteLevel:   true,
		ignoreMrg:   true,
		vocab:       make(map[string]uint32, len(ranks)),
		idToToken:   make([]string, size),
		addedByID:   map[uint32]string{},
		specialIDs:  map[uint32]bool{},
		pre:         []preStep{splitStep{sp}},
		nextPiece:   sp.(pieceFinder),
		newlineSafe: true,
	}
	for tok, r := range ranks {
		t.vocab[tok] = uint32(r)
		t.idToToken[r] = tok
	}
	t.vocabTab = newVocabTable(t.vocab)
	for b := 0; b < 256; b++ {
		t.byteIDs[b] = t.vocab[string([]byte{byte(b)})]
	}
	t.model.merges = make(map[uint64]uint64, len(ranks))
	for tok, r := range ranks {
		for k := 1; k < len(tok); k++ {
			a, okA := t.vocab[tok[:k]]
			b, okB := t.vocab[tok[k:]]
			if okA && okB {
				t.model.merges[pairKey(a, b)] = uint64(r)<<32 | uint64(r)
			}
		}
	}
	t.model.pairs = newPairTable(t.model.merges)
	var added []addedToken
	for s, id := range specials {
		t.idToToken[id] = s
		t.addedByID[id] = s
		t.specialIDs[id] = true
		added = append(added, addedToken{content: s, id: id, special: true})
	}
	t.added = newAddedMatcher(added)
	return t
}
