package mocker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/kvgate/kvgate/tokenizer"
)

// POST /v1/responses: OpenAI's Responses API, served as vLLM serves it
// (vllm/entrypoints/openai/serving_responses.py): the input read into the
// chat completions form (tokenizer.ParseChat, as the router reads it),
// rendered and generated like a chat request. The shapes are the openai
// Node SDK's (openai 7.60.0, resources/responses/responses.d.ts: Response,
// ResponseOutputMessage, ResponseOutputText, ResponseFunctionToolCall,
// ResponseUsage, and the stream events ResponseCreatedEvent …
// ResponseCompletedEvent / ResponseIncompleteEvent). The mocker stores no
// response: previous_response_id is a 400.
//
// The mocker has no end-of-sequence token: a text answer stops at
// max_output_tokens, so it is "incomplete" with incomplete_details
// {"reason": "max_output_tokens"} (chat's finish_reason "length"). A
// function call (chooseTool) is "completed": its arguments are a JSON
// object of the generated words.

type responsesRequest struct {
	Model              string          `json:"model"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Instructions       *string         `json:"instructions"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Metadata           json.RawMessage `json:"metadata"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	RoutedDPRank       *int            `json:"routed_dp_rank"`
	CacheSalt          *string         `json:"cache_salt"`
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	body, e := s.readBody(w, r)
	var req responsesRequest
	var g genRequest
	var chat *tokenizer.ChatRequest
	if e == nil {
		req, g, chat, e = s.parseResponses(body)
	}
	var u *apiRun
	q := &responseState{req: req, model: g.model, maxTokens: g.maxTokens, id: s.newID("resp_"), created: time.Now().Unix()}
	if e == nil {
		u, e = s.admit(r, g, q.id)
	}
	if e != nil {
		e.write(w)
		return
	}
	q.tool, q.calls = chooseTool(chat)
	q.itemID = s.newID("msg_")
	if q.calls {
		q.itemID, q.callID = s.newID("fc_"), s.newID("call_")
	}
	if !req.Stream {
		var text strings.Builder
		q.startText(&text)
		c, ok := u.each(r.Context(), func(t string) { text.WriteString(q.piece(t)) })
		if !ok {
			return
		}
		q.endText(&text)
		writeJSON(w, u.rank, q.object(q.status(), []any{q.item(text.String(), true)}, c))
		return
	}
	startSSE(w, u.rank)
	seq := 0
	send := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		sseEvent(w, typ, fields)
	}
	send("response.created", map[string]any{"response": q.object("in_progress", []any{}, Completion{})})
	send("response.in_progress", map[string]any{"response": q.object("in_progress", []any{}, Completion{})})
	send("response.output_item.added", map[string]any{"output_index": 0, "item": q.item("", false)})
	var text strings.Builder
	if q.calls {
		q.startText(&text)
		send("response.function_call_arguments.delta", map[string]any{"item_id": q.itemID, "output_index": 0, "delta": text.String()})
	} else {
		send("response.content_part.added", map[string]any{"item_id": q.itemID, "output_index": 0, "content_index": 0, "part": outputText("")})
	}
	c, ok := u.each(r.Context(), func(t string) {
		p := q.piece(t)
		text.WriteString(p)
		if q.calls {
			send("response.function_call_arguments.delta", map[string]any{"item_id": q.itemID, "output_index": 0, "delta": p})
			return
		}
		send("response.output_text.delta", map[string]any{"item_id": q.itemID, "output_index": 0, "content_index": 0, "delta": p, "logprobs": []any{}})
	})
	if !ok {
		return
	}
	tail := text.Len()
	q.endText(&text)
	if q.calls {
		send("response.function_call_arguments.delta", map[string]any{"item_id": q.itemID, "output_index": 0, "delta": text.String()[tail:]})
		send("response.function_call_arguments.done", map[string]any{"item_id": q.itemID, "output_index": 0, "arguments": text.String(), "name": q.tool.Name})
	} else {
		send("response.output_text.done", map[string]any{"item_id": q.itemID, "output_index": 0, "content_index": 0, "text": text.String(), "logprobs": []any{}})
		send("response.content_part.done", map[string]any{"item_id": q.itemID, "output_index": 0, "content_index": 0, "part": outputText(text.String())})
	}
	send("response.output_item.done", map[string]any{"output_index": 0, "item": q.item(text.String(), true)})
	final := "response.completed"
	if q.status() == "incomplete" {
		final = "response.incomplete"
	}
	send(final, map[string]any{"response": q.object(q.status(), []any{q.item(text.String(), true)}, c)})
}

// parseResponses reads a /v1/responses body into the request, its
// generation and its chat form.
func (s *Server) parseResponses(body []byte) (responsesRequest, genRequest, *tokenizer.ChatRequest, *httpError) {
	var req responsesRequest
	if e := unmarshal(body, &req); e != nil {
		return req, genRequest{}, nil, e
	}
	if req.PreviousResponseID != nil && *req.PreviousResponseID != "" {
		return req, genRequest{}, nil, badRequest("unsupported_previous_response_id", "previous_response_id is not supported: the mocker stores no responses; send the whole conversation in input")
	}
	var chat *tokenizer.ChatRequest
	g, e := s.prepare(req.Model, req.MaxOutputTokens, req.Stream, nil, func() ([]uint32, *httpError) {
		ids, c, e := s.encodeChatPath(tokenizer.PathResponses, body)
		chat = c
		return ids, e
	})
	g.chat, g.dpRank = true, req.RoutedDPRank
	if e == nil {
		g.salt, e = cacheSalt(req.CacheSalt)
	}
	return req, g, chat, e
}

// responseState is one Responses request being answered.
type responseState struct {
	args                 argsJSON
	req                  responsesRequest
	model                string
	maxTokens            int
	id, itemID, callID   string
	created              int64
	tool                 apiTool
	calls                bool // the answer is a call of tool
	finished, incomplete bool
}

func (q *responseState) startText(b *strings.Builder) {
	if q.calls {
		q.args.arg = q.tool.Arg
		b.WriteString(q.args.open())
	}
}

func (q *responseState) piece(t string) string {
	if q.calls {
		return q.args.piece(t)
	}
	return t
}

func (q *responseState) endText(b *strings.Builder) {
	if q.calls {
		b.WriteString(q.args.close())
	}
	q.finished, q.incomplete = true, !q.calls
}

// status is the response's: a text answer ends at max_output_tokens.
func (q *responseState) status() string {
	switch {
	case !q.finished:
		return "in_progress"
	case q.incomplete:
		return "incomplete"
	}
	return "completed"
}

// item is the output item: a message with one output_text part, or a
// function_call; done says whether it is finished (its text whole).
func (q *responseState) item(text string, done bool) map[string]any {
	status := "in_progress"
	if done {
		status = q.status()
	}
	if q.calls {
		return map[string]any{"id": q.itemID, "type": "function_call", "status": status, "call_id": q.callID, "name": q.tool.Name, "arguments": text}
	}
	content := []any{}
	if done {
		content = []any{outputText(text)}
	}
	return map[string]any{"id": q.itemID, "type": "message", "role": "assistant", "status": status, "content": content}
}

func outputText(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
}

// object is the Response: the request's settings echoed, its output and,
// once finished, its usage.
func (q *responseState) object(status string, output []any, c Completion) map[string]any {
	rq := q.req
	o := map[string]any{
		"id": q.id, "object": "response", "created_at": q.created, "status": status, "model": q.model,
		"output": output, "error": nil, "incomplete_details": nil, "instructions": rq.Instructions,
		"metadata": rawOr(rq.Metadata, map[string]any{}), "parallel_tool_calls": rq.ParallelToolCalls == nil || *rq.ParallelToolCalls,
		"temperature": rq.Temperature, "top_p": rq.TopP, "tool_choice": rawOr(rq.ToolChoice, "auto"),
		"tools": rawOr(rq.Tools, []any{}), "max_output_tokens": q.maxTokens, "previous_response_id": nil,
		"usage": nil,
	}
	if status == "incomplete" {
		o["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	}
	if q.finished {
		o["usage"] = map[string]any{
			"input_tokens": c.PromptTokens, "input_tokens_details": map[string]any{"cached_tokens": c.CachedTokens},
			"output_tokens": c.OutputTokens, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
			"total_tokens": c.PromptTokens + c.OutputTokens,
		}
	}
	return o
}

// rawOr is raw as given, or def when absent or null.
func rawOr(raw json.RawMessage, def any) any {
	if t := bytes.TrimSpace(raw); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return def
	}
	return raw
}
