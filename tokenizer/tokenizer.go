// Package tokenizer turns request text into the token ids the inference
// engine will compute, so that the routers hash the same KV blocks as the
// engine caches. ParseBody reads an inference request body (completions,
// chat completions, the Responses API, Anthropic messages) into a prompt
// or a ChatRequest: every message field, tools, chat_template_kwargs and
// the rest that shapes the prompt. The global router loads one Model per
// served model with Load and calls Encode (completions) or EncodeChat
// (chats), which renders the model's chat template as vLLM does
// (transformers' apply_chat_template: Python's tojson, JSON objects in
// the client's key order), natively for well-known templates.
//
// Backends, chosen per model in Config.Backend:
//   - "openai": the cl100k_base and o200k_base encodings, embedded in the
//     binary (the default for local runs and tests), with a ChatML chat
//     template.
//   - "huggingface": a tokenizer.json with a BPE model (byte-level as GPT-2,
//     Llama-3 and Qwen; SentencePiece-style as Llama-2 and Mistral), plus
//     the chat template of tokenizer_config.json.
//   - "remote": an engine's vLLM-style /tokenize endpoint.
//   - "estimate": no tokenizer; 4-byte chunks of the text. Approximate: the
//     ids match nothing an engine computes, only themselves, which is enough
//     for prefix matching in the routers' approximate mode.
//
// Token ids are uint32 throughout kvgate.
//
// # Files
//
// tokenizer.go (Tokenizer, ErrUnknownID, ErrNoChatTemplate, ErrConfig),
// model.go (Config, Load, Model: Encode, EncodeChat, RenderChat, its
// metrics), set.go (Set, LoadSet: one Model per served model), request.go
// (ChatRequest, Message, ToolCall, NewChat), body.go (Body, BodyError,
// ParseBody, ParseBodyWith, ParseChat: completions and chat completions
// bodies), salt.go (cache_salt as vLLM and SGLang accept it, SGLang's
// extra_key),
// body_alt.go (the Responses API and Anthropic messages bodies),
// dupkeys.go (DuplicateKeys: a key named twice in one object, refused or
// read last-wins as Python's json reads it), media.go
// (MediaSpan, EncodeChatMedia: the media placeholders' tokens), chat.go
// (the chat template: loading it from tokenizer_config.json, ChatML for
// the OpenAI encodings), chatjinja.go (rendering through gonja as
// transformers does: the template's data, Python's tojson), chatnative.go
// (plain-Go renderers of well-known templates), chatcache.go (the cache of
// a rendered chat's segments' ids), huggingface.go (the huggingface
// backend: tokenizer.json, ErrUnsupported), components.go (its
// normalizers, pre-tokenizer steps, post-processor and decoders),
// pretokenize.go (the split patterns of GPT-2, cl100k_base and Qwen by
// hand, regexp2 for others), added.go (special and added tokens matched
// before pre-tokenizing), bpe.go (the BPE merge loop), table.go (the
// open-addressing vocabulary and merge tables), openai.go (the openai
// backend: the embedded cl100k_base and o200k_base encodings), remote.go
// (the remote backend: an engine's /tokenize), estimate.go (the estimate
// backend: 4-byte chunks).
package tokenizer

import (
	"errors"
	"unicode/utf8"
)

// Tokenizer encodes text to token ids and back.
//
// Implementations are safe for concurrent use, do not retain or modify
// their arguments, and do not block except the remote backend, which calls
// the engine under its configured timeout.
type Tokenizer interface {
	// Encode returns the ids the engine computes for a completion prompt:
	// special tokens written in the text (<|im_start|>, <s>) are recognised
	// as such, and the tokens the model adds (a BOS) are added, as Hugging
	// Face tokenizers do with add_special_tokens=true. Invalid UTF-8 bytes
	// are each read as U+FFFD, as a JSON decoder would have done.
	Encode(text string) ([]uint32, error)
	// Decode returns the text of ids, special tokens included. An id
	// outside the vocabulary is an error wrapping ErrUnknownID.
	Decode(ids []uint32) (string, error)
	// Name identifies the tokenizer in logs and metrics.
	Name() string
}

var (
	// ErrUnknownID: Decode got an id that is not in the vocabulary.
	ErrUnknownID = errors.New("tokenizer: unknown token id")
	// ErrNoChatTemplate: the model has no chat template to render.
	ErrNoChatTemplate = errors.New("tokenizer: model has no chat template")
	// ErrConfig: Load got a configuration it cannot act on (unknown
	// backend or encoding, missing path or URL).
	ErrConfig = errors.New("tokenizer: invalid configuration")
)

// sanitizeUTF8 replaces each invalid byte with U+FFFD, as encoding/json
// does when it decodes a request body.
func sanitizeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, "\uFFFD"...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return string(b)
}
