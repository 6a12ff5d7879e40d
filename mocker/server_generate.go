package mocker

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/membership"
)

func (s *Server) generate(w http.ResponseWriter, r *http.Request, g genRequest) {
	prefix := "cmpl-"
	if g.chat {
		prefix = "chatcmpl-"
	}
	id := prefix + strconv.FormatUint(s.seq.Add(1), 36) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	req := g.request(id)
	rank, e := s.rankFor(r, g)
	if e != nil {
		writeError(w, e.status, e.code, e.message)
		return
	}
	l := s.ranks[rank]
	st, err := l.submit(req, r.Header.Get(HeaderRequestID))
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
				var kv map[string]any
				if s.cfg.Engine.Role == membership.RolePrefill {
					kv = s.prefillParams(r, rank, id, c)
				}
				s.writeFull(w, g, id, created, text.String(), c, kv)
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
	// A chat stream's first chunk carries the role alone, and it goes out
	// with the engine's first output, not before: vLLM sends it on the
	// first iteration over the engine's results (serving_chat.py,
	// chat_completion_stream_generator, "Send first response for each
	// request.n (index) with the role" @ 003fe5932dc9), so a request still
	// waiting for admission or in prefill has sent headers and nothing else.
	roleSent := !g.chat
	first := func() {
		if roleSent {
			return
		}
		roleSent = true
		send(map[string]any{"id": id, "object": object, "created": created, "model": g.model,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}}})
	}
	if g.chat {
		object = "chat.completion.chunk"
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
			first()
			for _, tok := range st.take() {
				send(chunk(tokenText(tok), nil))
			}
		case c := <-st.done:
			first()
			for _, tok := range st.take() {
				send(chunk(tokenText(tok), nil))
			}
			final := chunk("", c.Reason)
			if s.cfg.Engine.Role == membership.RolePrefill {
				final["kv_transfer_params"] = s.prefillParams(r, rank, id, c)
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

func (s *Server) writeFull(w http.ResponseWriter, g genRequest, id string, created int64, text string, c Completion, kv map[string]any) {
	resp := map[string]any{"id": id, "created": created, "model": g.model, "usage": usageOf(c)}
	if g.chat {
		resp["object"] = "chat.completion"
		resp["choices"] = []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "logprobs": nil, "finish_reason": c.Reason}}
	} else {
		resp["object"] = "text_completion"
		resp["choices"] = []any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": c.Reason}}
	}
	if kv != nil {
		resp["kv_transfer_params"] = kv
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

func usageOf(c Completion) usage {
	u := usage{PromptTokens: c.PromptTokens, CompletionTokens: c.OutputTokens, TotalTokens: c.PromptTokens + c.OutputTokens}
	u.PromptTokensDetails.CachedTokens = c.CachedTokens
	return u
}

func tokenText(t Token) string { return " " + wordFor(t.ID) }
