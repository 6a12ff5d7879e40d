package mocker

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	// PrefillTimeout bounds a decode-role mocker's prefill hop and KV pull
	// (DefaultPrefillTimeout); past it the answer is a 504 (pd.go).
	PrefillTimeout time.Duration
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
// /v1/chat/completions (SSE with stream: true), /v1/responses (OpenAI's
// Responses API), /v1/messages (Anthropic's), /v1/models and
// /v1/models/{id}, /tokenize,
// /health and /metrics. Create with NewServer, start the engine with Run,
// serve Handler.
type Server struct {
	cfg   ServerConfig
	log   *slog.Logger
	ranks []*live // one per data-parallel rank
	reg   prometheus.Gatherer
	mux   *http.ServeMux
	seq   atomic.Uint64
	pd    *pd
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
	// Observer (nil: none) is told when each rank admits and lets go of a
	// request (observe.go).
	Observer RequestObserver
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
		l := newLive(eng, clock, sink, log.With("dp_rank", r), nil)
		l.obs, l.index = opts.Observer, r
		s.ranks = append(s.ranks, l)
	}
	// Every rank has the same engine configuration (a rank's own cache).
	if ec := s.ranks[0].eng.Config(); s.cfg.MaxModelLen <= 0 || s.cfg.MaxModelLen > ec.NumBlocks*ec.BlockSize {
		s.cfg.MaxModelLen = ec.NumBlocks * ec.BlockSize
	}
	s.pd = newPD(reg, cfg.PrefillTimeout)
	m := newServerMetrics(reg, cfg.Model, s.ranks)
	for _, l := range s.ranks {
		l.m = m
	}
	s.mux.HandleFunc("POST /v1/completions", s.completions)
	s.mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("GET /v1/models/{id}", s.model)
	s.mux.HandleFunc("POST /v1/responses", s.responses)
	s.mux.HandleFunc("POST /v1/messages", s.messages)
	s.mux.HandleFunc("POST "+PathKVRead, s.kvReadHandler)
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
	defer s.pd.close()
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
		t.HeldBlocks += st.HeldBlocks
		t.ExpiredHolds += st.ExpiredHolds
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
