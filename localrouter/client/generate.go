package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/kvgate/kvgate/api/routing"
)

// GenerateOptions shape a Generate call. The zero value routes
// automatically with the router's cost parameters.
type GenerateOptions struct {
	// Worker forces the worker (custom routing); nil lets the router choose.
	Worker *routing.WorkerKey
	// Override changes the router's cost parameters for this request.
	Override *routing.Override
	// RequestID names the request in the router (default: random).
	RequestID string
	// LoRAName is the adapter the prompt runs with: it is mixed into the
	// block hashes (adapters never share cached blocks). The worker selects
	// the adapter by model name, as vLLM does.
	LoRAName string
	// MaxTokens, Temperature, TopP and Stop are OpenAI sampling options
	// (zero: the server's defaults).
	MaxTokens   int
	Temperature *float64
	TopP        *float64
	Stop        []string
	// Extra fields merged into the completion request body.
	Extra map[string]any
	// Scheme of the worker URL (default "http").
	Scheme string
}

// Chunk is one streamed piece of the completion.
type Chunk struct {
	Text string
	// TokenIDs, when the worker reports them (vLLM's return_token_ids).
	TokenIDs     []uint32
	FinishReason string
}

// Stream is a running completion. Recv returns its chunks, then io.EOF.
// The request is freed in the router at the end of the stream, on an
// error, on Close, and when the Generate context ends.
//
// Not safe for concurrent use.
type Stream struct {
	sel      routing.Selection
	tracker  *Tracker
	body     io.ReadCloser
	sse      *sseReader
	prefill  bool
	finished bool
	err      error
	once     sync.Once
}

// Generate routes tokens (the prompt's token ids) to a worker of the pool,
// calls the worker's OpenAI-compatible /v1/completions with the token ids
// as the prompt and stream: true, and returns the streamed completion. The
// request is committed in the router before the call, marked prefill
// complete at the first chunk with text or tokens, and freed at the end.
//
// ctx bounds the whole completion, not only this call.
func (c *Client) Generate(ctx context.Context, tokens []uint32, model string, opts GenerateOptions) (*Stream, error) {
	if len(tokens) == 0 {
		return nil, routing.ErrEmptyRequest
	}
	id := opts.RequestID
	if id == "" {
		id = newRequestID()
	}
	p := Prompt{Tokens: tokens, LoRAName: opts.LoRAName}
	worker := opts.Worker
	if worker == nil {
		sel, err := c.BestWorker(ctx, p, BestWorkerOptions{Override: opts.Override})
		if err != nil {
			return nil, err
		}
		k := routing.Selected(sel)
		worker = &k
	}
	// The Track stream owns the request from its commit on: if this
	// process dies, the router frees it.
	tr, err := c.Track(ctx, id, *worker, p)
	if err != nil {
		return nil, err
	}
	sel := tr.Selection()
	if sel.Address == "" {
		tr.Close()
		return nil, fmt.Errorf("worker %s has no registered address", routing.Selected(sel))
	}
	body := map[string]any{"model": model, "prompt": tokens, "stream": true}
	if opts.MaxTokens > 0 {
		body["max_tokens"] = opts.MaxTokens
	}
	if opts.Temperature != nil {
		body["temperature"] = *opts.Temperature
	}
	if opts.TopP != nil {
		body["top_p"] = *opts.TopP
	}
	if len(opts.Stop) > 0 {
		body["stop"] = opts.Stop
	}
	for k, v := range opts.Extra {
		body[k] = v
	}
	b, err := json.Marshal(body)
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("completion request: %w", err)
	}
	scheme := opts.Scheme
	if scheme == "" {
		scheme = "http"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, scheme+"://"+sel.Address+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("completion request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-Request-Id", id)
	// vLLM's data-parallel rank header (ignored by single-rank workers).
	req.Header.Set("X-Data-Parallel-Rank", strconv.FormatUint(uint64(sel.DPRank), 10))
	resp, err := c.http.Do(req)
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("worker %s at %s: %w", routing.Selected(sel), sel.Address, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		tr.Close()
		return nil, fmt.Errorf("worker %s at %s: %s: %s", routing.Selected(sel), sel.Address, resp.Status, bytes.TrimSpace(msg))
	}
	return &Stream{sel: sel, tracker: tr, body: resp.Body, sse: newSSEReader(resp.Body)}, nil
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Selection is the worker the request runs on.
func (s *Stream) Selection() routing.Selection { return s.sel }

// RequestID is the request's id in the router.
func (s *Stream) RequestID() string { return s.tracker.RequestID() }

// completionChunk is the part of an OpenAI streamed completion chunk read.
type completionChunk struct {
	Choices []struct {
		Text         string   `json:"text"`
		TokenIDs     []uint32 `json:"token_ids"`
		FinishReason *string  `json:"finish_reason"`
	} `json:"choices"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Recv returns the next chunk, or io.EOF at the end of the completion.
func (s *Stream) Recv() (Chunk, error) {
	if s.err != nil {
		return Chunk{}, s.err
	}
	for {
		data, err := s.sse.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				if !s.finished {
					err = io.ErrUnexpectedEOF
				}
			}
			return Chunk{}, s.fail(err)
		}
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			s.finished = true
			return Chunk{}, s.fail(io.EOF)
		}
		var cc completionChunk
		if err := json.Unmarshal(data, &cc); err != nil {
			return Chunk{}, s.fail(fmt.Errorf("worker %s: bad completion chunk: %w", routing.Selected(s.sel), err))
		}
		if cc.Error != nil {
			return Chunk{}, s.fail(fmt.Errorf("worker %s: %s", routing.Selected(s.sel), cc.Error.Message))
		}
		if len(cc.Choices) == 0 {
			continue // e.g. a usage-only chunk
		}
		ch := Chunk{Text: cc.Choices[0].Text, TokenIDs: cc.Choices[0].TokenIDs}
		if fr := cc.Choices[0].FinishReason; fr != nil {
			ch.FinishReason = *fr
		}
		if ch.Text == "" && len(ch.TokenIDs) == 0 && ch.FinishReason == "" {
			continue // e.g. the role-only first chunk
		}
		if !s.prefill && (ch.Text != "" || len(ch.TokenIDs) > 0) {
			s.prefill = true
			// A router that lost the request (expiry, worker removed) is no
			// reason to stop the completion.
			_ = s.tracker.PrefillComplete()
		}
		return ch, nil
	}
}

// fail ends the stream with err (io.EOF: done), freeing the request.
func (s *Stream) fail(err error) error {
	s.err = err
	s.release()
	return err
}

func (s *Stream) release() {
	s.once.Do(func() {
		s.body.Close()
		if err := s.tracker.Free(); err != nil {
			s.tracker.Close()
		}
	})
}

// Close stops reading and frees the request. Safe to call more than once
// and after the end of the stream.
func (s *Stream) Close() error {
	if s.err == nil {
		s.err = errors.New("stream closed")
	}
	s.release()
	return nil
}
