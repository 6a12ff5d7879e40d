package extproc

import (
	"bytes"
	"encoding/json"
)

// Usage is a response's token usage.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// wireUsage is a usage object in any of the APIs' spellings: OpenAI's
// chat and completions (prompt_tokens, completion_tokens), the Responses
// API's and Anthropic's (input_tokens, output_tokens). A field left out
// (or null: Anthropic's message_delta has input_tokens null) is nil.
type wireUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	InputTokens      *int64 `json:"input_tokens"`
	OutputTokens     *int64 `json:"output_tokens"`
	// Anthropic's input_tokens leave out the prompt tokens read from or
	// written to its cache; the prompt is their sum.
	CacheRead     *int64 `json:"cache_read_input_tokens"`
	CacheCreation *int64 `json:"cache_creation_input_tokens"`
}

// usageOf reads the usage of one response or stream event: the top-level
// usage (OpenAI's responses and chunks, Anthropic's message and
// message_delta), the Responses API's response.usage (its
// response.completed event) or Anthropic's message.usage (message_start).
// ok is false when there is none. Fields the event leaves out keep prev's
// values: Anthropic's stream gives the input tokens in message_start and
// the output tokens in message_delta.
func usageOf(data []byte, prev Usage) (u Usage, ok bool) {
	if !bytes.Contains(data, []byte(`"usage"`)) {
		return Usage{}, false
	}
	type withUsage struct {
		Usage *wireUsage `json:"usage"`
	}
	var v struct {
		withUsage
		Response *withUsage `json:"response"`
		Message  *withUsage `json:"message"`
	}
	if json.Unmarshal(data, &v) != nil {
		return Usage{}, false
	}
	w := v.Usage
	for _, alt := range []*withUsage{v.Response, v.Message} {
		if w == nil && alt != nil {
			w = alt.Usage
		}
	}
	if w == nil {
		return Usage{}, false
	}
	u = prev
	for _, f := range []struct {
		dst  *int64
		srcs []*int64
	}{{&u.PromptTokens, []*int64{w.PromptTokens, w.InputTokens}}, {&u.CompletionTokens, []*int64{w.CompletionTokens, w.OutputTokens}}} {
		for _, s := range f.srcs {
			if s != nil {
				*f.dst = *s
				break
			}
		}
	}
	if w.PromptTokens == nil && w.InputTokens != nil {
		for _, c := range []*int64{w.CacheRead, w.CacheCreation} {
			if c != nil {
				u.PromptTokens += *c
			}
		}
	}
	return u, true
}
