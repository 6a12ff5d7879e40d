package mocker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/tokenizer"
)

// What the Responses (responses.go) and Anthropic Messages (messages.go)
// fronts share: admitting a generation on a rank and reading its tokens,
// the prompt of a body read as the chat its API stands for, and the
// mocker's tool calls.

// apiRun is one admitted generation.
type apiRun struct {
	l    *live
	st   *stream
	id   string
	rank int
}

// admit submits g under id on the rank r's headers or g name (rankFor).
// Its prefill is local even on a decode worker named a prefiller: llm-d's
// routing sidecar performs the P/D hop for /v1/chat/completions and
// /v1/completions only and passes every other path to the decoder as it
// is (llm-d/llm-d-routing-sidecar internal/proxy/proxy.go, createRoutes,
// commit 0eeb28bb548235682d8553a879a35be3a336113e), so g.remote and
// g.hold are never set here (pd.go sets them for chat and completions).
// Newer sidecars (llm-d/llm-d-inference-scheduler pkg/sidecar/proxy)
// split /v1/responses and /v1/messages too; the mocker plays the older
// one, as the disaggregate policy's default split_paths does.
func (s *Server) admit(r *http.Request, g genRequest, id string) (*apiRun, *httpError) {
	rank, e := s.rankFor(r, g)
	if e != nil {
		return nil, e
	}
	l := s.ranks[rank]
	st, err := l.submit(g.request(id), r.Header.Get(HeaderRequestID))
	if err != nil {
		code := "invalid_request"
		if errors.Is(err, ErrTooLong) {
			code = "context_length_exceeded"
		}
		return nil, badRequest(code, "%v", err)
	}
	return &apiRun{l: l, st: st, id: id, rank: rank}, nil
}

// each calls fn with each generated token's text as it comes and returns
// the completion; false when ctx ended first (the request is aborted).
func (u *apiRun) each(ctx context.Context, fn func(text string)) (Completion, bool) {
	for {
		select {
		case <-ctx.Done():
			u.l.abort(u.id)
			return Completion{}, false
		case <-u.st.ready:
			for _, tok := range u.st.take() {
				fn(tokenText(tok))
			}
		case c := <-u.st.done:
			for _, tok := range u.st.take() {
				fn(tokenText(tok))
			}
			return c, true
		}
	}
}

// newID is a fresh id with prefix ("resp_", "msg_", ...).
func (s *Server) newID(prefix string) string {
	return prefix + strconv.FormatUint(s.seq.Add(1), 36) + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
}

// encodeChatPath is encodeChat for a body of path's API
// (tokenizer.PathResponses, tokenizer.PathMessages): read into the chat
// completions form, as the router reads it, and encoded the same way.
func (s *Server) encodeChatPath(path string, body []byte) ([]uint32, *tokenizer.ChatRequest, *httpError) {
	chat, err := tokenizer.ParseChat(path, body)
	if err != nil {
		return nil, nil, badRequest("invalid_request", "%v", err)
	}
	if ct, ok := s.cfg.Tokenizer.(ChatTokenizer); ok {
		ids, err := ct.EncodeChat(chat)
		if err != nil {
			return nil, nil, badRequest("tokenize", "render or tokenize chat: %v", err)
		}
		if len(ids) == 0 {
			return nil, nil, badRequest("missing_prompt", "prompt has no tokens")
		}
		return ids, chat, nil
	}
	ids, e := s.encode(RenderChat(chat.Messages, true))
	return ids, chat, e
}

// apiTool is a function tool offered to the model: its name and the name
// of the argument the mocker fills.
type apiTool struct {
	Name string
	Arg  string
}

// chooseTool decides whether the mocker answers c with a call of one of
// its function tools rather than text, a deterministic stand-in for a
// model: when tool_choice forces a tool (names one: Responses'
// {"type":"function","name":...}, Anthropic's {"type":"tool","name":...},
// chat's {"type":"function","function":{"name":...}}; or any: Responses'
// and chat's "required", Anthropic's {"type":"any"}), or when it is auto
// (or unset) and the conversation does not end on a tool's result (the
// client has not answered a call yet). "none" (or no tool) is text. The
// tool called is the named one, else the first.
func chooseTool(c *tokenizer.ChatRequest) (apiTool, bool) {
	var tools []struct {
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if len(c.Tools) == 0 || json.Unmarshal(c.Tools, &tools) != nil || len(tools) == 0 {
		return apiTool{}, false
	}
	var mode string
	var choice struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if len(c.ToolChoice) > 0 && json.Unmarshal(c.ToolChoice, &mode) != nil && json.Unmarshal(c.ToolChoice, &choice) == nil {
		mode = choice.Type
	}
	forced := cmp.Or(choice.Name, choice.Function.Name)
	endsOnResult := len(c.Messages) > 0 && c.Messages[len(c.Messages)-1].Role == "tool"
	switch {
	case mode == "none":
		return apiTool{}, false
	case forced != "":
		for _, t := range tools {
			if t.Function.Name == forced {
				return apiTool{Name: forced, Arg: argName(t.Function.Parameters)}, true
			}
		}
		return apiTool{}, false
	case mode == "required" || mode == "any" || !endsOnResult:
		return apiTool{Name: tools[0].Function.Name, Arg: argName(tools[0].Function.Parameters)}, true
	}
	return apiTool{}, false
}

// argName is the argument a tool call fills with the generated text: the
// schema's first required property, else its first property by name,
// else "input".
func argName(schema json.RawMessage) string {
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return "input"
	}
	if len(s.Required) > 0 && s.Required[0] != "" {
		return s.Required[0]
	}
	keys := make([]string, 0, len(s.Properties))
	for k := range s.Properties {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) > 0 && keys[0] != "" {
		return keys[0]
	}
	return "input"
}

// argsJSON streams a tool call's arguments: the opening `{"arg": "`, the
// generated words escaped as a JSON string's inside, space-separated, and
// the closing `"}`, so the pieces concatenate to a JSON object.
type argsJSON struct {
	arg     string
	started bool
}

func (a *argsJSON) open() string {
	k, _ := json.Marshal(a.arg)
	return "{" + string(k) + `: "`
}

func (a *argsJSON) piece(text string) string {
	b, _ := json.Marshal(strings.TrimPrefix(text, " "))
	sep := " "
	if !a.started {
		sep, a.started = "", true
	}
	return sep + strings.Trim(string(b), `"`)
}

func (*argsJSON) close() string { return `"}` }

// sseEvent writes one named SSE event (event: name, data: v as JSON) and
// flushes it, as the Responses API and Anthropic stream.
func sseEvent(w http.ResponseWriter, name string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// startSSE sends the headers of an event stream at once (as vLLM's
// StreamingResponse does, before the first token).
func startSSE(w http.ResponseWriter, rank int) {
	w.Header().Set(HeaderServedDPRank, strconv.Itoa(rank))
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// writeJSON answers v with status 200.
func writeJSON(w http.ResponseWriter, rank int, v any) {
	w.Header().Set(HeaderServedDPRank, strconv.Itoa(rank))
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
