package tokenizer

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Backend names for Config.Backend.
const (
	BackendOpenAI      = "openai"
	BackendHuggingFace = "huggingface"
	BackendRemote      = "remote"
	BackendEstimate    = "estimate"
)

// Config chooses and configures one model's tokenizer.
type Config struct {
	// Model is the served model's name: in logs and metrics, and sent to
	// the engine by the remote backend.
	Model string `json:"model" yaml:"model"`
	// Backend is "openai", "huggingface", "remote" or "estimate".
	Backend string `json:"backend" yaml:"backend"`
	// Encoding (openai): "cl100k_base" (default) or "o200k_base".
	Encoding string `json:"encoding,omitempty" yaml:"encoding,omitempty"`
	// Path (huggingface): the model folder holding tokenizer.json and,
	// optionally, tokenizer_config.json / chat_template.jinja; or the
	// tokenizer.json file itself.
	Path string `json:"path,omitempty" yaml:"path,omitempty"`
	// ChatTemplate (openai, huggingface; optional): a .jinja file or a
	// tokenizer_config.json whose chat_template replaces the model's, or
	// an embedded template: "builtin:chatml", "builtin:qwen3"
	// (BuiltinQwen3, which renders tools and tool calls).
	ChatTemplate string `json:"chat_template,omitempty" yaml:"chat_template,omitempty"`
	// URL (remote): the engine's base URL; /tokenize is appended.
	URL string `json:"url,omitempty" yaml:"url,omitempty"`
	// Timeout (remote): per call; default 2s.
	Timeout time.Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	// CacheSize: entries of the chat prefix cache (local backends) or of
	// the answer cache (remote); default 4096, negative disables.
	CacheSize int `json:"cache_size,omitempty" yaml:"cache_size,omitempty"`

	// HTTPClient (remote; optional) replaces http.DefaultClient.
	HTTPClient *http.Client `json:"-" yaml:"-"`
	// Logger (optional) receives the load line; default slog.Default().
	Logger *slog.Logger `json:"-" yaml:"-"`
	// Registerer (optional) receives kvgate_tokenizer_* metrics.
	Registerer prometheus.Registerer `json:"-" yaml:"-"`
}

const (
	defaultTimeout   = 2 * time.Second
	defaultCacheSize = 4096
)

// Model is a loaded tokenizer with its chat template. It implements
// Tokenizer and is safe for concurrent use.
type Model struct {
	tok         Tokenizer
	backend     string
	approximate bool
	chat        *chatTemplate // nil: no template
	cache       *chatCache    // nil: no chat cache
	tokens      prometheus.Counter
	// log, model and toolsWarned: the one warning that a chat's tools
	// were rendered by a template that does not render them.
	log         *slog.Logger
	model       string
	toolsWarned atomic.Bool
}

var _ Tokenizer = (*Model)(nil)

// Load builds the tokenizer cfg names. Everything that can be checked is
// checked here, not at the first request: a missing or corrupt
// tokenizer.json is an error naming the file and what is wrong, an unknown
// backend or encoding, or a field the backend does not read, an error
// wrapping ErrConfig.
func Load(cfg Config) (*Model, error) {
	if err := cfg.CheckFields(); err != nil {
		return nil, err
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = defaultCacheSize
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "tokenizer")
	m := &Model{backend: cfg.Backend}
	switch cfg.Backend {
	case BackendOpenAI:
		if cfg.Encoding == "" {
			cfg.Encoding = "cl100k_base"
		}
		t, err := loadOpenAI(cfg.Encoding)
		if err != nil {
			return nil, err
		}
		m.tok = t
		if m.chat, err = newChatTemplate(chatMLTemplate, nil); err != nil {
			return nil, fmt.Errorf("tokenizer: built-in ChatML template: %w", err)
		}
	case BackendHuggingFace:
		if cfg.Path == "" {
			return nil, fmt.Errorf("%w: model %q: backend huggingface needs a path", ErrConfig, cfg.Model)
		}
		file, dir := cfg.Path, cfg.Path
		if st, err := os.Stat(cfg.Path); err == nil && st.IsDir() {
			file = filepath.Join(cfg.Path, "tokenizer.json")
		} else {
			dir = filepath.Dir(cfg.Path)
		}
		name := cfg.Model
		if name == "" {
			name = filepath.Base(dir)
		}
		t, err := loadHuggingFace(file, name)
		if err != nil {
			return nil, err
		}
		m.tok = t
		if m.chat, err = loadChatTemplate(dir, nil); err != nil {
			return nil, err
		}
	case BackendRemote:
		if cfg.URL == "" {
			return nil, fmt.Errorf("%w: model %q: backend remote needs a url", ErrConfig, cfg.Model)
		}
		m.tok = newRemote(cfg.URL, cfg.Model, cfg.Timeout, cfg.CacheSize, cfg.HTTPClient)
	case BackendEstimate:
		m.tok = estimate{}
		m.approximate = true
	case "":
		return nil, fmt.Errorf("%w: model %q: no tokenizer backend (one of openai, huggingface, remote, estimate)", ErrConfig, cfg.Model)
	default:
		return nil, fmt.Errorf("%w: model %q: unknown tokenizer backend %q (one of openai, huggingface, remote, estimate)", ErrConfig, cfg.Model, cfg.Backend)
	}
	if cfg.ChatTemplate != "" {
		if cfg.Backend != BackendOpenAI && cfg.Backend != BackendHuggingFace {
			return nil, fmt.Errorf("%w: model %q: chat_template applies to the openai and huggingface backends only", ErrConfig, cfg.Model)
		}
		var base map[string]any
		if m.chat != nil {
			base = m.chat.vars
		} else if cfg.Backend == BackendHuggingFace {
			base = specialVars(cfg.Path)
		}
		var ct *chatTemplate
		var err error
		if name, ok := strings.CutPrefix(cfg.ChatTemplate, BuiltinPrefix); ok {
			ct, err = builtinChatTemplate(name, base)
		} else {
			ct, err = loadChatTemplate(cfg.ChatTemplate, base)
		}
		if err != nil {
			return nil, err
		}
		if ct == nil {
			return nil, fmt.Errorf("%w: %s: no chat template in it", ErrConfig, cfg.ChatTemplate)
		}
		m.chat = ct
	}
	if _, ok := m.tok.(segmenter); ok && m.chat != nil && cfg.CacheSize > 0 {
		m.cache = newChatCache(cfg.CacheSize)
	}
	if err := m.register(cfg.Registerer, cfg.Model); err != nil {
		return nil, err
	}
	if h, ok := m.tok.(*hfTokenizer); ok && h.slowSplit {
		logger.Warn("tokenizer.json split pattern is not one of the hand-written ones; running it on regexp2 (slower, not checked against the reference)", "model", cfg.Model)
	}
	if m.approximate {
		logger.Warn("tokenizer is approximate: token ids are 4-byte chunks, not the engine's", "model", cfg.Model, "backend", m.backend, "approximate", true)
	} else {
		logger.Info("tokenizer loaded", "model", cfg.Model, "backend", m.backend, "tokenizer", m.tok.Name(), "chat_template", m.chat != nil, "approximate", false)
	}
	m.log, m.model = logger, cfg.Model
	return m, nil
}

var tokensDesc = prometheus.CounterOpts{
	Name: "kvgate_tokenizer_tokens_total",
	Help: "Tokens produced by Encode and EncodeChat, by model and backend; approximate=\"true\" for the estimate backend.",
}

func (m *Model) register(reg prometheus.Registerer, model string) error {
	if reg == nil {
		return nil
	}
	vec := prometheus.NewCounterVec(tokensDesc, []string{"model", "backend", "approximate"})
	if err := reg.Register(vec); err != nil {
		are := &prometheus.AlreadyRegisteredError{}
		if !errors.As(err, are) {
			return fmt.Errorf("tokenizer: metrics: %w", err)
		}
		vec = are.ExistingCollector.(*prometheus.CounterVec)
	}
	m.tokens = vec.WithLabelValues(model, m.backend, fmt.Sprint(m.approximate))
	return nil
}

func (m *Model) count(ids []uint32) {
	if m.tokens != nil {
		m.tokens.Add(float64(len(ids)))
	}
}

// Name is the underlying tokenizer's name.
func (m *Model) Name() string { return m.tok.Name() }

// Backend is the Config.Backend the model was loaded with.
func (m *Model) Backend() string { return m.backend }

// Approximate reports whether ids are an estimate (the estimate backend)
// rather than the engine's.
func (m *Model) Approximate() bool { return m.approximate }

// HasChatTemplate reports whether RenderChat can render locally.
func (m *Model) HasChatTemplate() bool { return m.chat != nil }

// RendersTools reports whether the model's chat template renders a
// request's tools (false without a template): a chat with tools rendered
// by one that does not loses them from its ids, silently.
func (m *Model) RendersTools() bool { return m.chat != nil && m.chat.tools }

// Encode: see Tokenizer.
func (m *Model) Encode(text string) ([]uint32, error) {
	ids, err := m.tok.Encode(text)
	if err == nil {
		m.count(ids)
	}
	return ids, err
}

// Decode: see Tokenizer.
func (m *Model) Decode(ids []uint32) (string, error) { return m.tok.Decode(ids) }

// RenderChat renders a chat request with the model's chat template, as
// the engine does before tokenizing a chat completion (see ChatRequest
// for what reaches the template). Without a template it returns
// ErrNoChatTemplate.
func (m *Model) RenderChat(req *ChatRequest) (string, error) {
	if m.chat == nil {
		return "", ErrNoChatTemplate
	}
	return m.chat.render(req)
}

// EncodeChat returns the ids the engine computes for a chat request:
// the rendered template tokenized without the tokens the model adds (the
// template writes its own BOS), as vLLM does. Local backends reuse the
// ids of the conversation's earlier turns from a bounded cache. The remote
// backend asks the engine, which renders its own template. The estimate
// backend encodes the messages' contents, role-tagged.
func (m *Model) EncodeChat(req *ChatRequest) ([]uint32, error) {
	var ids []uint32
	switch tok := m.tok.(type) {
	case *remote:
		var err error
		if ids, err = tok.encodeChat(req); err != nil {
			return nil, err
		}
	case estimate:
		ids, _ = tok.Encode(estimateChatText(req))
	default:
		text, err := m.RenderChat(req)
		if err != nil {
			return nil, err
		}
		if len(req.Tools) > 0 && !m.chat.tools && m.log != nil && m.toolsWarned.CompareAndSwap(false, true) {
			m.log.Warn("a chat with tools was rendered by a chat template that does not render tools: its ids omit them, unlike an engine whose template renders them (warned once)", "model", m.model, "tokenizer", m.tok.Name())
		}
		seg, ok := tok.(segmenter)
		switch {
		case ok && m.cache != nil:
			ids = m.cache.encode(seg, text)
		case ok:
			ids = make([]uint32, 0, len(text)/3+1)
			seg.segments(sanitizeUTF8(text), func(s segment) { ids = seg.appendSegment(ids, s) })
		default:
			if ids, err = tok.Encode(text); err != nil {
				return nil, err
			}
		}
	}
	m.count(ids)
	return ids, nil
}

// specialVars returns the special-token variables of the
// tokenizer_config.json beside a model's tokenizer.json, if any.
func specialVars(path string) map[string]any {
	dir := path
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		dir = filepath.Dir(path)
	}
	vars, _, _ := readTokenizerConfig(filepath.Join(dir, "tokenizer_config.json"))
	return vars
}

// estimateChatText is the text the estimate backend encodes for a chat:
// the messages' contents, role-tagged.
func estimateChatText(req *ChatRequest) string {
	var text strings.Builder
	for _, msg := range req.Messages {
		text.WriteString(msg.Role + ": " + msg.Content + "\n")
	}
	return text.String()
}

// CheckFields refuses a field set that cfg's backend does not read
// (encoding is openai's, path huggingface's, url and timeout remote's):
// a setting passed over in silence would tokenize otherwise than its
// author believes. Load calls it; a configuration's validation may call
// it before loading anything.
func (cfg Config) CheckFields() error {
	for _, f := range []struct {
		name, reader string
		set          bool
	}{
		{"encoding", BackendOpenAI, cfg.Encoding != ""},
		{"path", BackendHuggingFace, cfg.Path != ""},
		{"url", BackendRemote, cfg.URL != ""},
		{"timeout", BackendRemote, cfg.Timeout != 0},
	} {
		if f.set && cfg.Backend != f.reader && cfg.Backend != "" {
			return fmt.Errorf("%w: model %q: %s is read by the %s backend only, not %s", ErrConfig, cfg.Model, f.name, f.reader, cfg.Backend)
		}
	}
	return nil
}
