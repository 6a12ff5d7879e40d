package mocker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/kvgate/kvgate/tokenizer"
)

// readBody reads a request body up to the configured bound.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *httpError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &httpError{status: http.StatusRequestEntityTooLarge, code: "body_too_large", message: fmt.Sprintf("request body exceeds %d bytes", s.cfg.MaxBodyBytes)}
		}
		return nil, badRequest("invalid_body", "read body: %v", err)
	}
	return body, nil
}

func unmarshal(body []byte, v any) *httpError {
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("invalid_json", "invalid JSON body: %v", err)
	}
	return nil
}

// resolveModel maps the model field to the adapter name ("" for the base
// model).
func (s *Server) resolveModel(model string) (string, *httpError) {
	if model == "" || model == s.cfg.Model {
		return "", nil
	}
	for _, l := range s.cfg.LoRAs {
		if model == l {
			return l, nil
		}
	}
	return "", &httpError{status: http.StatusNotFound, code: "model_not_found", message: fmt.Sprintf("the model %q does not exist", model)}
}

func (s *Server) maxTokens(v *int) (int, *httpError) {
	if v == nil {
		return s.cfg.DefaultMaxTokens, nil
	}
	if *v <= 0 {
		return 0, badRequest("invalid_max_tokens", "max_tokens must be at least 1, got %d", *v)
	}
	return *v, nil
}

// promptTokens accepts a completion prompt as a string, a list of one
// string, a list of token ids, or a list of one list of token ids.
func (s *Server) promptTokens(raw json.RawMessage) ([]uint32, *httpError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("missing_prompt", "prompt is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return s.encode(text)
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, badRequest("missing_prompt", "prompt is empty")
		}
		return ids, nil
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err == nil {
		if len(texts) != 1 {
			return nil, badRequest("unsupported_batch", "the mocker takes one prompt per request, got %d", len(texts))
		}
		return s.encode(texts[0])
	}
	var idLists [][]uint32
	if err := json.Unmarshal(raw, &idLists); err == nil {
		if len(idLists) != 1 || len(idLists[0]) == 0 {
			return nil, badRequest("unsupported_batch", "the mocker takes one non-empty prompt per request, got %d", len(idLists))
		}
		return idLists[0], nil
	}
	return nil, badRequest("invalid_prompt", "prompt must be a string, a list of token ids, or a list of one of either")
}

func (s *Server) encode(text string) ([]uint32, *httpError) {
	if text == "" {
		return nil, badRequest("missing_prompt", "prompt is empty")
	}
	ids, err := s.cfg.Tokenizer.Encode(text)
	if err != nil {
		return nil, badRequest("tokenize", "tokenize prompt: %v", err)
	}
	if len(ids) == 0 {
		return nil, badRequest("missing_prompt", "prompt has no tokens")
	}
	return ids, nil
}

// encodeChat reads a chat body's messages and everything else that shapes
// its prompt (tokenizer.ParseBody) and encodes it: with the Tokenizer's
// own chat template when it is a ChatTokenizer, otherwise rendered with
// RenderChat and the generation prompt, as every chat request is.
func (s *Server) encodeChat(body []byte) ([]uint32, *httpError) {
	chat, err := tokenizer.ParseChat(tokenizer.PathChat, body)
	if err != nil {
		var be *tokenizer.BodyError
		if errors.As(err, &be) && be.Reason == tokenizer.ReasonMissingField {
			return nil, badRequest("missing_messages", "messages is required")
		}
		return nil, badRequest("invalid_message", "%v", err)
	}
	for i, m := range chat.Messages {
		if m.Role == "" {
			return nil, badRequest("invalid_message", "messages[%d]: role is required", i)
		}
	}
	if ct, ok := s.cfg.Tokenizer.(ChatTokenizer); ok {
		ids, err := ct.EncodeChat(chat)
		if err != nil {
			return nil, badRequest("tokenize", "render or tokenize chat: %v", err)
		}
		if len(ids) == 0 {
			return nil, badRequest("missing_prompt", "prompt has no tokens")
		}
		return ids, nil
	}
	return s.encode(RenderChat(chat.Messages, true))
}

type genRequest struct {
	// dpRank is the routed_dp_rank body field, nil when absent.
	dpRank *int
	chat   bool
	model  string
	lora   string
	// salt is the body's cache_salt ("" when absent): Request.CacheSalt.
	salt         string
	tokens       []uint32
	maxTokens    int
	stream       bool
	includeUsage bool
	// hold: a P/D prefill whose blocks stay pinned (prefill role); remote:
	// its KV was pulled from a prefiller (decode role). pd.go.
	hold, remote bool
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	s.serveGenerate(w, r, s.parseCompletion)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	s.serveGenerate(w, r, s.parseChat)
}

func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, parse func([]byte) (genRequest, *httpError)) {
	body, e := s.readBody(w, r)
	if e == nil {
		body, e = s.sidecar(r, body) // the P/D prefill hop (pd.go)
	}
	if e == nil {
		var g genRequest
		if g, e = parse(body); e == nil {
			if e = s.kvTransfer(r.Context(), body, &g); e == nil {
				s.generate(w, r, g)
				return
			}
		}
	}
	if r.Context().Err() != nil {
		return // the client is gone
	}
	e.write(w)
}

// parseCompletion turns a /v1/completions body into a generation request.
func (s *Server) parseCompletion(body []byte) (genRequest, *httpError) {
	var req completionRequest
	if e := unmarshal(body, &req); e != nil {
		return genRequest{}, e
	}
	if e := req.check(); e != nil {
		return genRequest{}, e
	}
	if req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > MaxLogprobs) {
		return genRequest{}, badRequest("invalid_logprobs", "logprobs must be between 0 and %d, got %d", MaxLogprobs, *req.Logprobs)
	}
	g, e := s.prepare(req.Model, req.MaxTokens, req.Stream, req.StreamOptions, func() ([]uint32, *httpError) {
		return s.promptTokens(req.Prompt)
	})
	g.dpRank = req.RoutedDPRank
	if e == nil {
		g.salt, e = cacheSalt(req.CacheSalt)
	}
	return g, e
}

// parseChat turns a /v1/chat/completions body into a generation request.
func (s *Server) parseChat(body []byte) (genRequest, *httpError) {
	var req chatRequest
	if e := unmarshal(body, &req); e != nil {
		return genRequest{}, e
	}
	if e := req.check(); e != nil {
		return genRequest{}, e
	}
	mt := req.MaxCompletionTokens
	if mt == nil {
		mt = req.MaxTokens
	}
	g, e := s.prepare(req.Model, mt, req.Stream, req.StreamOptions, func() ([]uint32, *httpError) {
		return s.encodeChat(body)
	})
	g.chat, g.dpRank = true, req.RoutedDPRank
	if e == nil {
		g.salt, e = cacheSalt(req.CacheSalt)
	}
	return g, e
}

// cacheSalt checks a body's cache_salt as vLLM's protocol validator does
// (vllm/entrypoints/openai/protocol.py: "Parameter 'cache_salt' must be a
// non-empty string if provided."): absent is no salt, empty is a 400.
func cacheSalt(s *string) (string, *httpError) {
	if s == nil {
		return "", nil
	}
	if *s == "" {
		return "", badRequest("invalid_request", "cache_salt: must be a non-empty string if provided")
	}
	return *s, nil
}

func (s *Server) prepare(model string, maxTokens *int, stream bool, so *streamOptions, tokens func() ([]uint32, *httpError)) (genRequest, *httpError) {
	g := genRequest{model: model, stream: stream, includeUsage: so != nil && so.IncludeUsage}
	if g.model == "" {
		g.model = s.cfg.Model
	}
	var e *httpError
	if g.lora, e = s.resolveModel(model); e != nil {
		return g, e
	}
	if g.tokens, e = tokens(); e != nil {
		return g, e
	}
	if g.maxTokens, e = s.maxTokens(maxTokens); e != nil {
		return g, e
	}
	// vLLM: a prompt that fills the context, or max_tokens past what is
	// left of it, is a 400; an unset max_tokens is what is left (here the
	// default, capped at what is left).
	room := s.cfg.MaxModelLen - len(g.tokens)
	switch {
	case room <= 0:
		return g, contextError(s.cfg.MaxModelLen, len(g.tokens), g.maxTokens, maxTokens != nil)
	case g.maxTokens > room && maxTokens != nil:
		return g, contextError(s.cfg.MaxModelLen, len(g.tokens), g.maxTokens, true)
	case g.maxTokens > room:
		g.maxTokens = room
	}
	return g, nil
}

// request is the engine request g asks for, under id.
func (g genRequest) request(id string) Request {
	return Request{
		ID:            id,
		Tokens:        g.tokens,
		MaxTokens:     g.maxTokens,
		LoRAName:      g.lora,
		CacheSalt:     g.salt,
		RemotePrefill: g.remote,
		HoldBlocks:    g.hold,
	}
}
