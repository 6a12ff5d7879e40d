package e2e

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/tokenizer"
)

// TestDuplicateKeysThroughGateway: a body naming a key twice is read one
// way by the whole system (issue 27 item 2). By default the router refuses
// it, 400 duplicate_key; with -duplicate-keys last it reads it as the
// mock engine (Python's json in vLLM) does, so the model routed is the
// model run and a stream flag is the one the engine obeys.
func TestDuplicateKeysThroughGateway(t *testing.T) {
	t.Parallel()
	const dupModel = `{"model":"mock-llama","model":"other","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	const dupStream = `{"model":"mock-llama","stream":false,"max_tokens":2,"messages":[{"role":"user","content":"hi"}],"stream":true}`
	t.Run("refuse", func(t *testing.T) {
		s := startSystem(t)
		ctx := testenv.ContextWithTimeout(t, testTimeout)
		c := httpClient(t)
		for _, body := range []string{dupModel, dupStream} {
			r := chat(t, ctx, c, s, body)
			if r.status != 400 || r.header.Get("x-kvgate-dropped-reason") != "duplicate_key" || !strings.Contains(string(r.body), "duplicate key") {
				t.Errorf("%s: %d %q %.300s, want 400 duplicate_key", body, r.status, r.header.Get("x-kvgate-dropped-reason"), r.body)
			}
		}
	})
	t.Run("last", func(t *testing.T) {
		s := startSystem(t, func(c *up.Config) { c.Extproc.DuplicateKeys = tokenizer.DuplicatesLast })
		ctx := testenv.ContextWithTimeout(t, testTimeout)
		c := httpClient(t)
		// The router reads "other", as the engine would: no pool serves it.
		if r := chat(t, ctx, c, s, dupModel); r.status != 404 || r.header.Get("x-kvgate-dropped-reason") != "unknown_model" {
			t.Errorf("duplicate model: %d %q %.300s, want the router's 404 unknown_model", r.status, r.header.Get("x-kvgate-dropped-reason"), r.body)
		}
		r := chat(t, ctx, c, s, dupStream)
		if r.status != 200 || len(r.events) == 0 {
			t.Errorf("duplicate stream: %d, %d events (%.300s), want a stream", r.status, len(r.events), r.body)
		}
		waitIdle(t, s)
	})
}
