package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// remote calls an engine's /tokenize and /detokenize endpoints (vLLM's
// API; SGLang and the kvgate mocker serve the same), with a timeout per
// call and a bounded cache of answers keyed by a 128-bit hash of the
// request.
type remote struct {
	name    string // model name sent to the engine
	base    string
	client  *http.Client
	timeout time.Duration
	seeds   [2]maphash.Seed
	cache   *lru.Cache[[2]uint64, []uint32] // nil: no cache
}

var _ Tokenizer = (*remote)(nil)

func newRemote(baseURL, model string, timeout time.Duration, cacheSize int, client *http.Client) *remote {
	if client == nil {
		client = http.DefaultClient
	}
	r := &remote{name: model, base: strings.TrimRight(baseURL, "/"), client: client, timeout: timeout,
		seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	if cacheSize > 0 {
		r.cache, _ = lru.New[[2]uint64, []uint32](cacheSize)
	}
	return r
}

func (r *remote) Name() string { return "remote:" + r.name }

// tokenizeRequest is vLLM's /tokenize body: a prompt, or a chat with
// every field that shapes its rendering.
type tokenizeRequest struct {
	Model                string          `json:"model,omitempty"`
	Prompt               *string         `json:"prompt,omitempty"`
	Messages             []Message       `json:"messages,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	ToolChoice           json.RawMessage `json:"tool_choice,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	AddSpecialTokens     bool            `json:"add_special_tokens"`
}

func (r *remote) Encode(text string) ([]uint32, error) {
	text = sanitizeUTF8(text)
	return r.tokenize(tokenizeRequest{Model: r.name, Prompt: &text, AddSpecialTokens: true})
}

// encodeChat asks the engine to apply its own chat template (vLLM's
// /tokenize with messages), so the ids are the engine's by construction.
func (r *remote) encodeChat(req *ChatRequest) ([]uint32, error) {
	gen := req.AddGenerationPrompt
	return r.tokenize(tokenizeRequest{Model: r.name, Messages: req.Messages, Tools: req.Tools, ToolChoice: req.ToolChoice,
		ChatTemplateKwargs: req.TemplateKwargs, AddGenerationPrompt: &gen, ContinueFinalMessage: req.ContinueFinalMessage})
}

func (r *remote) tokenize(req tokenizeRequest) ([]uint32, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var key [2]uint64
	if r.cache != nil {
		key = [2]uint64{maphash.Bytes(r.seeds[0], body), maphash.Bytes(r.seeds[1], body)}
		if ids, ok := r.cache.Get(key); ok {
			return append([]uint32(nil), ids...), nil
		}
	}
	var resp struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := r.post("/tokenize", body, &resp); err != nil {
		return nil, err
	}
	if r.cache != nil {
		r.cache.Add(key, append([]uint32(nil), resp.Tokens...))
	}
	return resp.Tokens, nil
}

func (r *remote) Decode(ids []uint32) (string, error) {
	body, err := json.Marshal(struct {
		Model  string   `json:"model,omitempty"`
		Tokens []uint32 `json:"tokens"`
	}{r.name, ids})
	if err != nil {
		return "", err
	}
	var resp struct {
		Prompt string `json:"prompt"`
	}
	if err := r.post("/detokenize", body, &resp); err != nil {
		return "", err
	}
	return resp.Prompt, nil
}

func (r *remote) post(path string, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("tokenizer: remote %s: %w", r.base, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("tokenizer: remote %s%s: %w", r.base, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("tokenizer: remote %s%s: %w", r.base, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		snippet := string(data)
		if len(snippet) > 200 {
			snippet = snippet[:200] + "..."
		}
		return fmt.Errorf("tokenizer: remote %s%s: status %d: %s", r.base, path, resp.StatusCode, snippet)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("tokenizer: remote %s%s: bad answer: %w", r.base, path, err)
	}
	return nil
}
