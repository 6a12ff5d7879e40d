package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// apiCase is one of the four APIs a client sends: its path, a body with a
// prompt, and where its answer reports the prompt tokens read from the
// engine's cache.
type apiCase struct {
	name, path string
	body       func(prompt string) string
	cached     func(body []byte) int
}

func jsonBody(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// apiCases: chat, completions, Responses and Anthropic Messages, each
// with the usage field its API reports cached prompt tokens in (chat and
// completions: usage.prompt_tokens_details.cached_tokens; Responses:
// usage.input_tokens_details.cached_tokens; Anthropic:
// usage.cache_read_input_tokens).
func apiCases() []apiCase {
	return []apiCase{
		{"chat", "/v1/chat/completions", func(p string) string { return chatBody("mock-llama", p, false, 2) }, func(b []byte) int {
			var v struct {
				Usage struct {
					Details struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			json.Unmarshal(b, &v)
			return v.Usage.Details.Cached
		}},
		{"completions", "/v1/completions", func(p string) string {
			return jsonBody(map[string]any{"model": "mock-llama", "prompt": p, "max_tokens": 2})
		}, nil},
		{"responses", "/v1/responses", func(p string) string {
			return jsonBody(map[string]any{"model": "mock-llama", "instructions": "You are terse.", "input": p, "max_output_tokens": 2})
		}, func(b []byte) int {
			var v struct {
				Usage struct {
					Details struct {
						Cached int `json:"cached_tokens"`
					} `json:"input_tokens_details"`
				} `json:"usage"`
			}
			json.Unmarshal(b, &v)
			return v.Usage.Details.Cached
		}},
		{"messages", "/v1/messages", func(p string) string {
			return jsonBody(map[string]any{"model": "mock-llama", "system": "You are terse.", "max_tokens": 2,
				"messages": []map[string]string{{"role": "user", "content": p}}})
		}, func(b []byte) int {
			var v struct {
				Usage struct {
					Cached int `json:"cache_read_input_tokens"`
				} `json:"usage"`
			}
			json.Unmarshal(b, &v)
			return v.Usage.Cached
		}},
	}
}

// TestAPIsRouteWithCache: the same long prompt sent twice through each of
// the four APIs lands on the same worker the second time, with the
// overlap the router reports being what the engine then reads from its
// cache (the engine recomputes at least the prompt's last token, so its
// hit is the router's overlap in blocks, or one block less when the
// prompt ends on a block boundary).
func TestAPIsRouteWithCache(t *testing.T) {
	s := startSystem(t, fixedProbes)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	const blockSize = 16
	for _, api := range apiCases() {
		t.Run(api.name, func(t *testing.T) {
			body := api.body(longPrompt("api "+api.name, 0))
			post := func() reply {
				resp := send(t, ctx, c, "POST", s.GatewayURL()+api.path, body)
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				r := reply{status: resp.StatusCode, header: resp.Header, body: b,
					pool: resp.Header.Get("x-kvgate-pool"), worker: resp.Header.Get("x-kvgate-worker-id")}
				fmt.Sscan(resp.Header.Get("x-kvgate-overlap-blocks"), &r.overlap)
				if r.status != 200 || r.worker == "" {
					t.Fatalf("POST %s: %d %s (worker %q)", api.path, r.status, b, r.worker)
				}
				return r
			}
			first := post()
			if first.overlap >= 20 {
				t.Errorf("first request overlap %d, want < 20 (only the system prompt can be cached yet)", first.overlap)
			}
			waitCached(t, s, first.pool, first.worker, 20)
			second := post()
			if second.pool != first.pool || second.worker != first.worker {
				t.Errorf("second send went to %s/%s, want %s/%s (where the prompt is cached)", second.pool, second.worker, first.pool, first.worker)
			}
			if second.overlap < 20 {
				t.Errorf("second send overlap %d blocks, want ≥ 20", second.overlap)
			}
			if api.cached == nil {
				return
			}
			hit := api.cached(second.body)
			t.Logf("second send: %s/%s, router overlap %d blocks, engine cache hit %d tokens", second.pool, second.worker, second.overlap, hit)
			if hit%blockSize != 0 || (hit/blockSize != second.overlap && hit/blockSize != second.overlap-1) {
				t.Errorf("engine read %d cached tokens (%d blocks), router reported %d blocks of overlap: body %s",
					hit, hit/blockSize, second.overlap, strings.TrimSpace(string(second.body)))
			}
		})
	}
	waitIdle(t, s)
}

// TestDisaggregatedOtherAPIs: on a disaggregated system a long prompt
// sent through the Responses or Messages API is not disaggregated: llm-d's
// sidecar makes the P/D hop for chat and completions only and passes
// other paths to the decoder (policies.SplitPaths, mocker/apis.go admit),
// so the router sends it to a decode worker naming no prefiller, which
// prefills it; the client gets its answer and no router keeps it.
func TestDisaggregatedOtherAPIs(t *testing.T) {
	t.Parallel()
	s := startDisaggregated(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	for _, api := range apiCases()[2:] {
		resp := send(t, ctx, c, "POST", s.GatewayURL()+api.path, api.body(longPrompt("disaggregated "+api.name, 0)), "x-kvgate-explain", "1")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("x-kvgate-pool") != up.DecodePool {
			t.Fatalf("%s: %d on %q: %s", api.name, resp.StatusCode, resp.Header.Get("x-kvgate-pool"), b)
		}
		if ex := resp.Header.Get("x-kvgate-explain"); !strings.Contains(ex, "not split by the P/D sidecar") || strings.Contains(ex, "prefill on prefill") {
			t.Errorf("%s was disaggregated:\n%s", api.name, ex)
		}
	}
	if st := s.Pool(up.PrefillPool).Workers[0].Stats(); st.PrefixQueryTokens != 0 {
		t.Errorf("the prefill worker prefilled %d tokens, want none", st.PrefixQueryTokens)
	}
	for _, w := range s.Pool(up.DecodePool).Workers {
		if hops := workerMetric(t, ctx, c, w, "kvgate_mocker_pd_prefill_requests_total", "ok"); hops != 0 {
			t.Errorf("decode worker %s made %v prefill hops for paths the sidecar passes through", w.ID, hops)
		}
	}
	waitIdle(t, s)
	waitStreamsClosed(t, s)
}
