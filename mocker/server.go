package mocker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/tokenizer"
)

// ServerConfig shapes the OpenAI-compatible front of a live engine.
type ServerConfig struct {
	Engine Config
	// Model is the served model name ("mock-model"); LoRAs are further
	// names accepted in the model field, each hashing its blocks apart.
	Model string
	LoRAs []string
	// Tokenizer turns text prompts into tokens (WordTokenizer{}).
	Tokenizer Tokenizer
	// DefaultMaxTokens applies when a request sets none (16).
	DefaultMaxTokens int
	// MaxBodyBytes bounds request bodies (DefaultMaxBodyBytes); past it
	// the answer is 413.
	MaxBodyBytes int64
	// MaxModelLen is the model's context length in tokens: a prompt plus
	// max_tokens above it is a 400, as vLLM answers (default: the KV
	// cache's size, NumBlocks × BlockSize, as /tokenize reports it).
	MaxModelLen int
	// WorkerID and Address are reported by a prefill-role engine as where
	// the KV is (kv_transfer_params).
	WorkerID, Address string
	// DPSize is the number of data-parallel ranks (1): each rank is an
	// Engine of its own (its own KV cache and scheduler, Engine config
	// each), its KV events tagged with its rank. A request names its rank
	// with the X-Data-Parallel-Rank header (vLLM's and SGLang's, any case)
	// or SGLang's routed_dp_rank body field; without either the least
	// loaded rank takes it, as an engine's internal load balancer would.
	// The rank that served it is in the x-mocker-dp-rank response header.
	DPSize int
}

// Headers of the data-parallel rank: the request's (HTTP header names are
// case-insensitive, so this is vLLM's X-data-parallel-rank and SGLang's
// X-Data-Parallel-Rank) and the mocker's answer naming the rank that
// served it.
const (
	HeaderDPRank       = "X-Data-Parallel-Rank"
	HeaderServedDPRank = "X-Mocker-Dp-Rank"
)

// MaxDPSize bounds ServerConfig.DPSize.
const MaxDPSize = 64

// Server is the mocker's HTTP API around a live engine: /v1/completions,
// /v1/chat/completions (SSE with stream: true), /v1/models, /tokenize,
// /health and /metrics. Create with NewServer, start the engine with Run,
// serve Handler.
type Server struct {
	cfg   ServerConfig
	log   *slog.Logger
	ranks []*live // one per data-parallel rank
	reg   prometheus.Gatherer
	mux   *http.ServeMux
	seq   atomic.Uint64
}

// ServerOptions are a Server's dependencies; all optional.
type ServerOptions struct {
	Logger *slog.Logger
	// Registry receives the vLLM-named metrics and is what /metrics
	// serves; nil means a fresh registry.
	Registry *prometheus.Registry
	// Sink receives KV events; nil drops them. With DPSize > 1, Sinks
	// gives one sink per rank instead (Sink is then unused).
	Sink  KVSink
	Sinks []KVSink
	Clock Clock
}

// NewServer builds a server with an idle engine.
func NewServer(cfg ServerConfig, opts ServerOptions) (*Server, error) {
	if cfg.Model == "" {
		cfg.Model = "mock-model"
	}
	if cfg.Tokenizer == nil {
		cfg.Tokenizer = WordTokenizer{}
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = 16
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("%w: max body bytes %d must not be negative", ErrConfig, cfg.MaxBodyBytes)
	}
	if cfg.DPSize == 0 {
		cfg.DPSize = 1
	}
	if cfg.DPSize < 1 || cfg.DPSize > MaxDPSize {
		return nil, fmt.Errorf("%w: dp_size %d must be within 1..%d", ErrConfig, cfg.DPSize, MaxDPSize)
	}
	if len(opts.Sinks) > 0 && len(opts.Sinks) != cfg.DPSize {
		return nil, fmt.Errorf("%w: %d sinks for dp_size %d", ErrConfig, len(opts.Sinks), cfg.DPSize)
	}
	if cfg.DPSize > 1 && opts.Sink != nil && len(opts.Sinks) == 0 {
		return nil, fmt.Errorf("%w: dp_size %d needs one sink per rank (ServerOptions.Sinks)", ErrConfig, cfg.DPSize)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "mocker")
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	clock := opts.Clock
	if clock == nil {
		clock = RealClock{}
	}
	s := &Server{cfg: cfg, log: log, reg: reg, mux: http.NewServeMux()}
	for r := range cfg.DPSize {
		eng, err := NewEngine(cfg.Engine)
		if err != nil {
			return nil, err
		}
		sink := opts.Sink
		if len(opts.Sinks) > 0 {
			sink = opts.Sinks[r]
		}
		s.ranks = append(s.ranks, newLive(eng, clock, sink, log.With("dp_rank", r), nil))
	}
	// Every rank has the same engine configuration (a rank's own cache).
	if ec := s.ranks[0].eng.Config(); s.cfg.MaxModelLen <= 0 || s.cfg.MaxModelLen > ec.NumBlocks*ec.BlockSize {
		s.cfg.MaxModelLen = ec.NumBlocks * ec.BlockSize
	}
	m := newServerMetrics(reg, cfg.Model, s.ranks)
	for _, l := range s.ranks {
		l.m = m
	}
	s.mux.HandleFunc("POST /v1/completions", s.completions)
	s.mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("POST /tokenize", s.tokenize)
	s.mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
		for _, l := range s.ranks {
			if !l.resetPrefixCache() {
				writeError(w, http.StatusConflict, "cache_in_use", "requests are running; the prefix cache cannot be reset now")
				return
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no route for "+r.Method+" "+r.URL.Path)
	})
	return s, nil
}

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler { return s.mux }

// Run drives the engines (one per rank) in real time until ctx ends.
// Requests submitted while Run is not running wait.
func (s *Server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, l := range s.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(ctx)
		}()
	}
	wg.Wait()
}

// DPSize is the number of data-parallel ranks.
func (s *Server) DPSize() int { return len(s.ranks) }

// Stats snapshots the engines, summed over the ranks (KVUsage is their
// mean).
func (s *Server) Stats() Stats {
	var t Stats
	for _, l := range s.ranks {
		st := l.stats()
		t.Running += st.Running
		t.Waiting += st.Waiting
		t.KVUsage += st.KVUsage / float64(len(s.ranks))
		t.UsedBlocks += st.UsedBlocks
		t.CachedBlocks += st.CachedBlocks
		t.TotalBlocks += st.TotalBlocks
		t.PrefixQueryTokens += st.PrefixQueryTokens
		t.PrefixHitTokens += st.PrefixHitTokens
		t.Preemptions += st.Preemptions
		t.Iterations += st.Iterations
		t.EvictedBlocks += st.EvictedBlocks
	}
	return t
}

// RankStats snapshots rank r's engine (r < DPSize).
func (s *Server) RankStats(r int) Stats { return s.ranks[r].stats() }

// CachedBlocks returns the sequence hashes in the prefix cache of rank 0.
func (s *Server) CachedBlocks() map[uint64]struct{} { return s.RankCachedBlocks(0) }

// RankCachedBlocks returns the sequence hashes in rank r's prefix cache.
func (s *Server) RankCachedBlocks(r int) map[uint64]struct{} {
	l := s.ranks[r]
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng.CachedBlocks()
}

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

// --- OpenAI wire types -------------------------------------------------

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
}

func (e *httpError) Error() string { return e.message }

// write sends e as the reply.
func (e *httpError) write(w http.ResponseWriter) {
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

// --- handlers ------------------------------------------------------------

type genRequest struct {
	// dpRank is the routed_dp_rank body field, nil when absent.
	dpRank       *int
	chat         bool
	model        string
	lora         string
	tokens       []uint32
	maxTokens    int
	stream       bool
	includeUsage bool
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
		var g genRequest
		if g, e = parse(body); e == nil {
			s.generate(w, r, g)
			return
		}
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
	return g, e
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

func (s *Server) generate(w http.ResponseWriter, r *http.Request, g genRequest) {
	prefix := "cmpl-"
	if g.chat {
		prefix = "chatcmpl-"
	}
	id := prefix + strconv.FormatUint(s.seq.Add(1), 36) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	req := Request{
		ID:            id,
		Tokens:        g.tokens,
		MaxTokens:     g.maxTokens,
		LoRAName:      g.lora,
		RemotePrefill: r.Header.Get("x-prefiller-host-port") != "",
	}
	rank, e := s.rankFor(r, g)
	if e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	l := s.ranks[rank]
	st, err := l.submit(req)
	if err != nil {
		code := "invalid_request"
		if errors.Is(err, ErrTooLong) {
			code = "context_length_exceeded"
		}
		writeError(w, http.StatusBadRequest, code, err.Error())
		return
	}
	w.Header().Set(HeaderServedDPRank, strconv.Itoa(rank))
	created := time.Now().Unix()
	ctx := r.Context()
	if !g.stream {
		var text strings.Builder
		for {
			select {
			case <-ctx.Done():
				l.abort(id)
				return
			case <-st.ready:
				for _, tok := range st.take() {
					text.WriteString(tokenText(tok))
				}
			case c := <-st.done:
				for _, tok := range st.take() {
					text.WriteString(tokenText(tok))
				}
				s.writeFull(w, g, id, created, text.String(), c)
				return
			}
		}
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	// The headers go out now, not with the first token: vLLM's
	// StreamingResponse sends http.response.start before it iterates the
	// generator, so a request waiting for admission already has its 200.
	if flusher != nil {
		flusher.Flush()
	}
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
		send(map[string]any{"id": id, "object": object, "created": created, "model": g.model,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}}})
	}
	chunk := func(text string, finish any) map[string]any {
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
		if g.chat {
			choice["delta"] = map[string]any{"content": text}
		} else {
			choice["text"] = text
		}
		m := map[string]any{"id": id, "object": object, "created": created, "model": g.model, "choices": []any{choice}}
		if g.includeUsage {
			m["usage"] = nil
		}
		return m
	}
	for {
		select {
		case <-ctx.Done():
			l.abort(id)
			return
		case <-st.ready:
			for _, tok := range st.take() {
				send(chunk(tokenText(tok), nil))
			}
		case c := <-st.done:
			for _, tok := range st.take() {
				send(chunk(tokenText(tok), nil))
			}
			final := chunk("", c.Reason)
			if s.cfg.Engine.Role == membership.RolePrefill {
				final["kv_transfer_params"] = s.kvTransferParams()
			}
			send(final)
			if g.includeUsage {
				send(map[string]any{"id": id, "object": object, "created": created, "model": g.model, "choices": []any{}, "usage": usageOf(c)})
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			if flusher != nil {
				flusher.Flush()
			}
			return
		}
	}
}

// rankFor picks the rank that serves a request: the X-Data-Parallel-Rank
// header (vLLM ignores a value that is not an integer, and so does the
// mocker), else the routed_dp_rank body field, else the least loaded
// rank (waiting counted 4 to 1 against running, as vLLM's DP load
// balancer weighs them). A rank out of range is a 400, as in vLLM.
func (s *Server) rankFor(r *http.Request, g genRequest) (int, *httpError) {
	want, set := 0, false
	if v := r.Header.Get(HeaderDPRank); v != "" {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			want, set = n, true
		}
	}
	if !set && g.dpRank != nil {
		want, set = *g.dpRank, true
	}
	if set {
		if want < 0 || want >= len(s.ranks) {
			return 0, badRequest("invalid_dp_rank", "data_parallel_rank %d is out of range [0, %d)", want, len(s.ranks))
		}
		return want, nil
	}
	if len(s.ranks) == 1 {
		return 0, nil
	}
	best, bestLoad := 0, -1
	for i, l := range s.ranks {
		st := l.stats()
		if load := 4*st.Waiting + st.Running; bestLoad < 0 || load < bestLoad {
			best, bestLoad = i, load
		}
	}
	return best, nil
}

func (s *Server) writeFull(w http.ResponseWriter, g genRequest, id string, created int64, text string, c Completion) {
	resp := map[string]any{"id": id, "created": created, "model": g.model, "usage": usageOf(c)}
	if g.chat {
		resp["object"] = "chat.completion"
		resp["choices"] = []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "logprobs": nil, "finish_reason": c.Reason}}
	} else {
		resp["object"] = "text_completion"
		resp["choices"] = []any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": c.Reason}}
	}
	if s.cfg.Engine.Role == membership.RolePrefill {
		resp["kv_transfer_params"] = s.kvTransferParams()
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

// kvTransferParams is how a prefill-role mocker reports that the KV is
// ready and where (shaped like vLLM's NIXL connector's reply).
func (s *Server) kvTransferParams() map[string]any {
	return map[string]any{"do_remote_decode": false, "do_remote_prefill": true, "remote_engine_id": s.cfg.WorkerID, "remote_address": s.cfg.Address}
}

func usageOf(c Completion) usage {
	u := usage{PromptTokens: c.PromptTokens, CompletionTokens: c.OutputTokens, TotalTokens: c.PromptTokens + c.OutputTokens}
	u.PromptTokensDetails.CachedTokens = c.CachedTokens
	return u
}

func tokenText(t Token) string { return " " + wordFor(t.ID) }

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	data := []any{map[string]any{"id": s.cfg.Model, "object": "model", "created": 0, "owned_by": "kvgate", "root": s.cfg.Model, "parent": nil}}
	for _, l := range s.cfg.LoRAs {
		data = append(data, map[string]any{"id": l, "object": "model", "created": 0, "owned_by": "kvgate", "root": l, "parent": s.cfg.Model})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// tokenize answers vLLM's /tokenize: {"prompt": …} or {"messages": […]}.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string          `json:"model"`
		Prompt   json.RawMessage `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
	}
	body, e := s.readBody(w, r)
	if e == nil {
		e = unmarshal(body, &req)
	}
	if e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	if _, e := s.resolveModel(req.Model); e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	var ids []uint32
	if req.Messages != nil {
		ids, e = s.encodeChat(body)
	} else {
		ids, e = s.promptTokens(req.Prompt)
	}
	if e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids})
}

// ConfigureHTTPServer makes hs, a Server's listener, accept cleartext
// HTTP/2 with prior knowledge (h2c) as well as HTTP/1.1, with 1,000
// streams per connection (Go's default 250). vLLM (uvicorn) speaks
// HTTP/1.1 only, so clients of real workers keep HTTP/1.1; a mocker also
// accepting h2c serves a gateway multiplexing upstream streams (the soak).
func ConfigureHTTPServer(hs *http.Server) {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs.Protocols = &p
	if hs.HTTP2 == nil {
		hs.HTTP2 = &http.HTTP2Config{}
	}
	hs.HTTP2.MaxConcurrentStreams = 1000
}
