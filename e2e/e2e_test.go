package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/localrouter"
)

// TestChat sends a chat completion through the gateway, streaming and not:
// it comes back from a mock worker with the routing headers, and the local
// router's loads return to zero.
func TestChat(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			r := chat(t, ctx, c, s, chatBody("mock-llama", "Tell me about KV caches.", stream, 8), "x-kvgate-explain", "1")
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			p := s.Pool(r.pool)
			if p == nil {
				t.Fatalf("x-kvgate-pool %q names no pool", r.pool)
			}
			var addr string
			dpSize := 0
			for _, w := range p.Workers {
				if w.ID == r.worker {
					addr, dpSize = w.Addr, w.DPSize
				}
			}
			if addr == "" || r.header.Get("x-kvgate-endpoint") != addr {
				t.Errorf("x-kvgate-worker-id %q, x-kvgate-endpoint %q: want a worker of %s and its address", r.worker, r.header.Get("x-kvgate-endpoint"), r.pool)
			}
			if rank, err := strconv.Atoi(r.header.Get("x-kvgate-dp-rank")); err != nil || rank < 0 || rank >= dpSize || r.header.Get("x-kvgate-overlap-blocks") == "" || r.header.Get("x-kvgate-explain") == "" {
				t.Errorf("headers %v: want a dp rank below the worker's %d, overlap blocks and an explanation", r.header, dpSize)
			}
			if stream {
				if n := len(r.events); n < 2 || r.events[n-1] != "[DONE]" {
					t.Errorf("SSE events %q: want chunks ending with [DONE]", r.events)
				}
			} else {
				var v struct {
					Choices []struct{ Message struct{ Content string } }
					Usage   struct {
						PromptTokens int `json:"prompt_tokens"`
					}
				}
				if err := json.Unmarshal(r.body, &v); err != nil || len(v.Choices) != 1 || v.Usage.PromptTokens == 0 {
					t.Errorf("body %s (%v): want one choice and usage", r.body, err)
				}
			}
			waitIdle(t, s)
		})
	}
}

// TestSharedPrefixSameWorker: requests sharing a long prefix, sent one
// after the other (no load to balance), land on the same worker, with the
// cached prefix reported as overlap.
func TestSharedPrefixSameWorker(t *testing.T) {
	s := startSystem(t, fixedProbes)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	for _, topic := range []string{"routing", "caching"} {
		first := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt(topic, 0), false, 4))
		if first.status != 200 {
			t.Fatalf("status %d: %s", first.status, first.body)
		}
		if first.overlap >= 20 {
			t.Errorf("%s: first request overlap %d, want < 20 (only the system prompt can be cached yet)", topic, first.overlap)
		}
		waitCached(t, s, first.pool, first.worker, 20)
		for v := 1; v <= 3; v++ {
			r := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt(topic, v), false, 4))
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if r.pool != first.pool || r.worker != first.worker {
				t.Errorf("%s variant %d went to %s/%s, want %s/%s (where the prefix is cached)", topic, v, r.pool, r.worker, first.pool, first.worker)
			}
			if r.overlap < 20 {
				t.Errorf("%s variant %d: overlap %d blocks, want ≥ 20 (the shared prefix)", topic, v, r.overlap)
			}
		}
	}
	waitIdle(t, s)
}

// waitCached polls until worker's local router has indexed every block
// the worker caches, at least n (KV events travel through NATS after the
// response). At least n alone is no wait for the last request's blocks
// when earlier requests already put n there.
func waitCached(t testing.TB, s *up.System, pool, worker string, n int) {
	t.Helper()
	p := s.Pool(pool)
	var w *up.Worker
	for _, x := range p.Workers {
		if x.ID == worker {
			w = x
		}
	}
	if w == nil {
		t.Fatalf("pool %s has no worker %s", pool, worker)
	}
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		got, cached := p.Router.Router().Index().TreeSize(localrouter.WorkerKey{ID: worker}), w.RankStats(0).CachedBlocks
		return fmt.Sprintf("%s/%s: %d blocks indexed of the %d it caches, want all and ≥ %d", pool, worker, got, cached, n), got >= n && got == cached
	})
}

// TestStoppedPoolSkipped: with pool-a's local router stopped, requests are
// still served, by pool-b.
func TestStoppedPoolSkipped(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	if err := s.Pool("pool-a").StopRouter(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		r := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt("failover", i), i%2 == 0, 4))
		if r.status != 200 {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
		if r.pool != "pool-b" {
			t.Errorf("request %d served by %q, want pool-b", i, r.pool)
		}
	}
	waitIdle(t, s)
}

// TestLifecycleWithRealRouter follows one streamed request on its local
// router: in flight with its prompt pending until the first chunk, prefill
// complete after it, and freed when the client goes away mid-stream.
func TestLifecycleWithRealRouter(t *testing.T) {
	t.Parallel()
	s := startSystem(t, func(c *up.Config) { c.Speedup = 1 }) // slow decode: the stream outlives the checks
	c := httpClient(t)
	ctx, cancel := context.WithCancel(testenv.ContextWithTimeout(t, testTimeout))
	defer cancel()
	resp := postChat(t, ctx, c, s.GatewayURL(), chatBody("mock-llama", longPrompt("lifecycle", 0), true, 4000))
	defer resp.Body.Close()
	p := s.Pool(resp.Header.Get("x-kvgate-pool"))
	if resp.StatusCode != 200 || p == nil {
		t.Fatalf("status %d pool %q", resp.StatusCode, resp.Header.Get("x-kvgate-pool"))
	}
	worker := localrouter.WorkerKey{ID: resp.Header.Get("x-kvgate-worker-id")}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first chunk is through
		t.Fatal(err)
	}
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		l := p.Loads()[worker]
		return fmt.Sprintf("load of %v after the first chunk %+v, want 1 request, no prefill pending", worker, l),
			l.ActiveRequests == 1 && l.PrefillTokens == 0 && p.Requests() == 1
	})
	cancel() // the client goes away mid-stream
	waitIdle(t, s)
}

// TestErrorsThroughGateway: refusals come back OpenAI-shaped with the
// dropped reason, and leave nothing in flight.
func TestErrorsThroughGateway(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	for _, tc := range []struct {
		name, body string
		hdr        []string
		status     int
		reason     string
	}{
		{"unknown model", chatBody("no-such-model", "hi", false, 4), nil, 404, "unknown_model"},
		{"bad json", `{"model":"mock-llama","messages":[`, nil, 400, "bad_json"},
		{"missing messages", `{"model":"mock-llama"}`, nil, 400, "missing_field"},
		{"pinned to an unknown pool", chatBody("mock-llama", "hi", false, 4), []string{"x-kvgate-pool", "pool-z"}, 400, "pin_refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := chat(t, ctx, c, s, tc.body, tc.hdr...)
			if r.status != tc.status || r.header.Get("x-kvgate-dropped-reason") != tc.reason {
				t.Fatalf("status %d reason %q (%s), want %d %q", r.status, r.header.Get("x-kvgate-dropped-reason"), r.body, tc.status, tc.reason)
			}
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Message == "" {
				t.Errorf("body %s: want an OpenAI error", r.body)
			}
		})
	}
	// A pin that can be honoured is.
	r := chat(t, ctx, c, s, chatBody("mock-llama", "hi", false, 4), "x-kvgate-pool", "pool-b", "x-kvgate-worker-id", "pool-b-w1")
	if r.status != 200 || r.pool != "pool-b" || r.worker != "pool-b-w1" {
		t.Errorf("pinned request: status %d pool %q worker %q, want 200 pool-b pool-b-w1", r.status, r.pool, r.worker)
	}
	waitIdle(t, s)
}
