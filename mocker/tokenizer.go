package mocker

import (
	"strings"
	"unicode"

	"github.com/kvgate/kvgate/tokenizer"
)

// Tokenizer turns prompt text into token ids. Implementations must be safe
// for concurrent use and deterministic (equal text, equal ids), or prefix
// caching means nothing. The tokenizer/ package provides real ones.
type Tokenizer interface {
	Encode(text string) ([]uint32, error)
}

// WordTokenizer is the built-in Tokenizer: one token per word and one per
// punctuation character, each the FNV-1a hash of its text modulo Vocab
// (32000 if zero). It is not any model's tokenizer, but it is deterministic
// and a shared text prefix gives a shared token prefix, which is all the
// mocker's prefix cache needs.
type WordTokenizer struct {
	Vocab uint32
}

var _ Tokenizer = WordTokenizer{}

// Encode implements Tokenizer.
func (w WordTokenizer) Encode(text string) ([]uint32, error) {
	vocab := w.Vocab
	if vocab == 0 {
		vocab = 32000
	}
	out := make([]uint32, 0, len(text)/4+1)
	emit := func(s string) {
		h := uint32(2166136261)
		for i := 0; i < len(s); i++ {
			h ^= uint32(s[i])
			h *= 16777619
		}
		out = append(out, h%vocab)
	}
	start := -1
	for i, r := range text {
		switch {
		case unicode.IsSpace(r):
			if start >= 0 {
				emit(text[start:i])
				start = -1
			}
		case unicode.IsPunct(r) || unicode.IsSymbol(r):
			if start >= 0 {
				emit(text[start:i])
				start = -1
			}
			emit(string(r))
		default:
			if start < 0 {
				start = i
			}
		}
	}
	if start >= 0 {
		emit(text[start:])
	}
	return out, nil
}

// ChatTokenizer is a Tokenizer that also renders and encodes chat
// requests with a model's chat template, as *tokenizer.Model does: a
// server given one encodes chats with it, so its token ids are those of a
// router configured with the same tokenizer. Same contract as Tokenizer.
type ChatTokenizer interface {
	Tokenizer
	EncodeChat(req *tokenizer.ChatRequest) ([]uint32, error)
}

// RenderChat renders a conversation with the mocker's own chat template,
// the text its chat endpoints and /tokenize encode when its Tokenizer is
// not a ChatTokenizer: "<|role|>\ncontent\n" per
// message, then, with addGenerationPrompt (the server always adds it),
// "<|assistant|>\n". It is no model's template; with the built-in tokenizer
// only determinism matters (a shared conversation prefix gives a shared
// token prefix). A router that must compute the same token ids as mock
// workers (prefix matching depends on it) renders chats with it before
// encoding with the workers' Tokenizer.
func RenderChat(messages []tokenizer.Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range messages {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|assistant|>\n")
	}
	return b.String()
}

// words is the vocabulary the mocker writes its output with.
var words = strings.Fields(`the of and to in is that it was for on are as with his they at be
this from have or by one had not but what all were when we there can an your which their said
if do will each about how up out them then she many some so these would other into has more her
two like him see time could no make than first been its who now people my made over did down only
way find use may water long little very after words called just where most know`)

// wordFor renders a generated token id as text.
func wordFor(id uint32) string { return words[int(id)%len(words)] }
