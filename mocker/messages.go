package mocker

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/tokenizer"
)

// POST /v1/messages: Anthropic's Messages API, served as vLLM's Anthropic
// front serves it (vllm/entrypoints/anthropic): the messages read into
// the chat completions form (tokenizer.ParseChat, as the router reads
// them), rendered and generated like a chat request. The shapes are the
// @anthropic-ai/sdk Node SDK's (1.16.0, resources/messages/messages.d.ts:
// Message, TextBlock, ToolUseBlock, Usage, and the stream events
// RawMessageStartEvent, RawContentBlockStartEvent,
// RawContentBlockDeltaEvent (TextDelta, InputJSONDelta),
// RawContentBlockStopEvent, RawMessageDeltaEvent, RawMessageStopEvent);
// errors are Anthropic's (resources/shared.d.ts ErrorResponse).
//
// max_tokens is required, as Anthropic requires it. Without an
// end-of-sequence token a text answer stops at max_tokens (stop_reason
// "max_tokens"); a tool call (chooseTool) stops with "tool_use", its
// input an object of the generated words. Usage follows Anthropic's
// meaning: input_tokens are the prompt tokens not read from the cache,
// cache_read_input_tokens those that were (the prefix cache hit).

type messagesRequest struct {
	Model        string  `json:"model"`
	MaxTokens    *int    `json:"max_tokens"`
	Stream       bool    `json:"stream"`
	RoutedDPRank *int    `json:"routed_dp_rank"`
	CacheSalt    *string `json:"cache_salt"`
}

func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	body, e := s.readBody(w, r)
	var req messagesRequest
	var g genRequest
	var chat *tokenizer.ChatRequest
	if e == nil {
		req, g, chat, e = s.parseMessages(body)
	}
	id := s.newID("msg_")
	var u *apiRun
	if e == nil {
		u, e = s.admit(r, g, id)
	}
	if e != nil {
		writeAnthropicError(w, e.status, e.message)
		return
	}
	tool, calls := chooseTool(chat)
	toolID := s.newID("toolu_")
	stop := "max_tokens"
	if calls {
		stop = "tool_use"
	}
	message := func(content []any, stopReason any, usage map[string]any) map[string]any {
		return map[string]any{"id": id, "type": "message", "role": "assistant", "model": g.model, "content": content,
			"stop_reason": stopReason, "stop_sequence": nil, "stop_details": nil, "container": nil, "diagnostics": nil, "usage": usage}
	}
	args := &argsJSON{arg: tool.Arg}
	if !req.Stream {
		var text strings.Builder
		c, ok := u.each(r.Context(), func(t string) {
			if calls {
				t = args.piece(t)
			}
			text.WriteString(t)
		})
		if !ok {
			return
		}
		block := map[string]any{"type": "text", "text": text.String(), "citations": nil}
		if calls {
			block = toolUse(toolID, tool.Name, json.RawMessage(args.open()+text.String()+args.close()))
		}
		writeJSON(w, u.rank, message([]any{block}, stop, anthropicUsage(c)))
		return
	}
	startSSE(w, u.rank)
	startUsage := anthropicUsage(Completion{PromptTokens: len(g.tokens)})
	sseEvent(w, "message_start", map[string]any{"type": "message_start", "message": message([]any{}, nil, startUsage)})
	block := map[string]any{"type": "text", "text": "", "citations": nil}
	if calls {
		block = toolUse(toolID, tool.Name, json.RawMessage("{}"))
	}
	sseEvent(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": block})
	delta := func(t string) {
		d := map[string]any{"type": "text_delta", "text": t}
		if calls {
			d = map[string]any{"type": "input_json_delta", "partial_json": t}
		}
		sseEvent(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": d})
	}
	if calls {
		delta(args.open())
	}
	c, ok := u.each(r.Context(), func(t string) {
		if calls {
			t = args.piece(t)
		}
		delta(t)
	})
	if !ok {
		return
	}
	if calls {
		delta(args.close())
	}
	sseEvent(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	sseEvent(w, "message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil, "stop_details": nil, "container": nil},
		"usage": anthropicUsage(c)})
	sseEvent(w, "message_stop", map[string]any{"type": "message_stop"})
}

// parseMessages reads a /v1/messages body into the request, its
// generation and its chat form.
func (s *Server) parseMessages(body []byte) (messagesRequest, genRequest, *tokenizer.ChatRequest, *httpError) {
	var req messagesRequest
	if e := unmarshal(body, &req); e != nil {
		return req, genRequest{}, nil, e
	}
	if req.MaxTokens == nil {
		return req, genRequest{}, nil, badRequest("invalid_request", "max_tokens: field required")
	}
	var chat *tokenizer.ChatRequest
	g, e := s.prepare(req.Model, req.MaxTokens, req.Stream, nil, func() ([]uint32, *httpError) {
		ids, c, e := s.encodeChatPath(tokenizer.PathMessages, body)
		chat = c
		return ids, e
	})
	g.chat, g.dpRank = true, req.RoutedDPRank
	if e == nil {
		g.salt, e = cacheSalt(req.CacheSalt)
	}
	return req, g, chat, e
}

func toolUse(id, name string, input json.RawMessage) map[string]any {
	return map[string]any{"type": "tool_use", "id": id, "name": name, "input": input, "caller": map[string]any{"type": "direct"}}
}

// anthropicUsage is c's usage in Anthropic's meaning (Usage: input_tokens
// not counting the cache read, cache_read_input_tokens).
func anthropicUsage(c Completion) map[string]any {
	return map[string]any{
		"input_tokens": c.PromptTokens - c.CachedTokens, "output_tokens": c.OutputTokens,
		"cache_read_input_tokens": c.CachedTokens, "cache_creation_input_tokens": 0, "cache_creation": nil,
		"inference_geo": nil, "output_tokens_details": nil, "server_tool_use": nil, "service_tier": "standard", "speed": nil,
	}
}

// writeAnthropicError answers an error in Anthropic's shape,
// {"type":"error","error":{"type":...,"message":...},"request_id":null},
// the type by status from the SDK's ErrorType list.
func writeAnthropicError(w http.ResponseWriter, status int, msg string) {
	typ := "api_error"
	switch {
	case status == http.StatusNotFound:
		typ = "not_found_error"
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		typ = "overloaded_error"
	case status >= 400 && status < 500:
		typ = "invalid_request_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}, "request_id": nil})
}
