package overload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
)

// outcome is one request's end.
type outcome struct {
	priority, tenant string
	status           int
	// refused: 429 or 503, the router's answer to saturation (or to no
	// pool); a request never silently disappears: it is served, refused,
	// or failed (err).
	refused bool
	ttftMS  float64
	e2eMS   float64
	end     time.Time
	err     string
}

// send sends one streamed chat completion with the priority and tenant
// headers (and the trust token, so they are believed) and reads it to
// the end. TTFT is the time to the first chunk carrying generated text
// (the role-only chunk OpenAI-compatible servers send first does not
// count).
func (b *bench) send(ctx context.Context, n int, priority, tenant string) (o outcome) {
	o = outcome{priority: priority, tenant: tenant}
	body, _ := json.Marshal(map[string]any{
		"model": b.cfg.Model, "stream": true, "max_tokens": b.cfg.MaxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt(n)}},
	})
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	defer func() {
		o.end = time.Now()
		o.e2eMS = float64(o.end.Sub(start).Microseconds()) / 1000
	}()
	req, err := http.NewRequestWithContext(rctx, "POST", b.base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		o.err = err.Error()
		return o
	}
	req.Header.Set("content-type", "application/json")
	if b.cfg.TrustToken != "" {
		req.Header.Set(globalrouter.DefaultTrustHeader, b.cfg.TrustToken)
	}
	if priority != "" {
		req.Header.Set(globalrouter.HeaderPriority, priority)
		// The client states the TTFT target its class is judged by:
		// flow control bounds the request's wait by it (the replay's
		// --flow-control does the same; the Shedding chain reads it not).
		if p, err := strconv.Atoi(priority); err == nil && b.slo[p] > 0 {
			req.Header.Set(globalrouter.HeaderTTFT, strconv.FormatInt(int64(math.Ceil(b.slo[p])), 10))
		}
	}
	if tenant != "" {
		req.Header.Set(b.cfg.TenantHeader, tenant)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		o.err = "before the response: " + err.Error()
		return o
	}
	defer resp.Body.Close()
	o.status = resp.StatusCode
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		o.refused = true
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return o
	case resp.StatusCode != http.StatusOK:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.err = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return o
	}
	br := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			if data == "[DONE]" {
				done = true
			} else if o.ttftMS == 0 && hasText(data) {
				o.ttftMS = float64(time.Since(start).Microseconds()) / 1000
			}
		}
		if err != nil {
			switch {
			case !errors.Is(err, io.EOF):
				o.err = "mid-stream: " + err.Error()
			case !done:
				o.err = "the stream ended without [DONE]"
			case o.ttftMS == 0:
				o.err = "the stream carried no text"
			}
			return o
		}
	}
}

// hasText reports whether an SSE chunk of a chat completion carries
// generated text.
func hasText(data string) bool {
	var c struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	return json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 && c.Choices[0].Delta.Content != ""
}

// prompt is a short preamble shared by one of 16 handbooks (4 sections,
// so the cache and the routing matter) and a body of its own (20
// sentences): the active KV of a worker then grows with its requests in
// flight, which is what Shedding reads.
func prompt(n int) string {
	var b strings.Builder
	topic := (n * 7) % 16
	for i := range 4 {
		fmt.Fprintf(&b, "Section %d of handbook %d explains how a cached prefix saves prefill work. ", i, topic)
	}
	for i := range 20 {
		fmt.Fprintf(&b, "Line %d of question %d asks what the handbook says next. ", i, n)
	}
	return b.String()
}
