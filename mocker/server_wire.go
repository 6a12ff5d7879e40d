package mocker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// DefaultMaxBodyBytes is the request body bound of a server that sets
// none; `kvgate up` uses the same value for the ext_proc server's cap and
// for every model's max_body_bytes, so the router never accepts (and
// tokenizes) what a worker refuses.
const DefaultMaxBodyBytes = 4 << 20

// Bounds of the sampling fields the mocker reads; past them a request is a
// 400 (vLLM's default max_logprobs is 20; OpenAI takes up to 4 stop
// sequences, the mocker a few more).
const (
	MaxLogprobs      = 20
	MaxStopSequences = 16
)

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// sampling are the fields of both request kinds the mocker bounds but
// does not act on (it generates one choice of max_tokens tokens).
type sampling struct {
	N           *int            `json:"n"`
	Stop        json.RawMessage `json:"stop"`
	TopLogprobs *int            `json:"top_logprobs"`
}

type completionRequest struct {
	sampling
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	Logprobs      *int            `json:"logprobs"`
	// RoutedDPRank is SGLang's body field naming the DP rank.
	RoutedDPRank *int `json:"routed_dp_rank"`
	// CacheSalt is vLLM's cache_salt (saltedBlocks).
	CacheSalt *string `json:"cache_salt"`
}

type chatRequest struct {
	sampling
	Logprobs            *bool          `json:"logprobs"`
	Model               string         `json:"model"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	RoutedDPRank        *int           `json:"routed_dp_rank"`
	CacheSalt           *string        `json:"cache_salt"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// apiError is an OpenAI-shaped error body.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var e apiError
	e.Error.Message = msg
	e.Error.Code = code
	switch {
	case status == http.StatusNotFound:
		e.Error.Type = "not_found_error"
	case status >= 500:
		e.Error.Type = "server_error"
	default:
		e.Error.Type = "invalid_request_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(e)
}

// httpError is a request error bound for an OpenAI-shaped reply.
type httpError struct {
	status  int
	code    string
	message string
	vllm    bool // vLLM's error shape (writeVLLMError)
	// raw, when set, is answered as is with status (a prefiller's error,
	// passed through as llm-d's sidecar does), typed rawType.
	raw     []byte
	rawType string
}

func (e *httpError) Error() string { return e.message }

// write sends e as the reply.
func (e *httpError) write(w http.ResponseWriter) {
	if e.raw != nil {
		writeRaw(w, e.status, e.rawType, e.raw)
		return
	}
	if e.vllm {
		writeVLLMError(w, e.status, e.message)
		return
	}
	writeError(w, e.status, e.code, e.message)
}

// writeVLLMError answers as vLLM's OpenAI server does for a request it
// validates away (vllm/entrypoints/openai/serving_engine.py,
// create_error_response: ErrorResponse{error: ErrorInfo{message, type
// "BadRequestError", param null, code 400}}).
func writeVLLMError(w http.ResponseWriter, status int, msg string) {
	typ := "BadRequestError"
	if status >= 500 {
		typ = "InternalServerError"
	}
	body := map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// contextError is vLLM's 400 for a request longer than the model's
// context (serving_engine.py, _validate_input), word for word.
func contextError(maxModelLen, promptLen, maxTokens int, explicit bool) *httpError {
	if promptLen >= maxModelLen || !explicit {
		return &httpError{status: http.StatusBadRequest, code: "context_length_exceeded", vllm: true, message: fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
			maxModelLen, promptLen)}
	}
	return &httpError{status: http.StatusBadRequest, code: "context_length_exceeded", vllm: true, message: fmt.Sprintf(
		"'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
		maxTokens, maxModelLen, promptLen, maxTokens, maxModelLen, promptLen)}
}

func badRequest(code, format string, args ...any) *httpError {
	return &httpError{status: http.StatusBadRequest, code: code, message: fmt.Sprintf(format, args...)}
}

// check bounds the sampling fields: one choice, at most MaxLogprobs top
// logprobs, at most MaxStopSequences stop strings.
func (p *sampling) check() *httpError {
	if p.N != nil && *p.N != 1 {
		return badRequest("invalid_n", "n must be 1 (the mocker generates one choice), got %d", *p.N)
	}
	if p.TopLogprobs != nil && (*p.TopLogprobs < 0 || *p.TopLogprobs > MaxLogprobs) {
		return badRequest("invalid_top_logprobs", "top_logprobs must be between 0 and %d, got %d", MaxLogprobs, *p.TopLogprobs)
	}
	raw := bytes.TrimSpace(p.Stop)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return badRequest("invalid_stop", "stop must be a string or a list of strings")
	}
	if len(list) > MaxStopSequences {
		return badRequest("invalid_stop", "stop takes at most %d sequences, got %d", MaxStopSequences, len(list))
	}
	return nil
}
