package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// startDisaggregated runs `kvgate up --topology disaggregated`: one
// prefill worker, two decode workers.
func startDisaggregated(t *testing.T) *up.System {
	t.Helper()
	return startSystem(t, func(c *up.Config) {
		c.Topology, c.Pools = up.TopologyDisaggregated, up.DisaggregatedPools(1, 2)
	})
}

// workerMetric reads a counter of a mocker's /metrics (0 when absent).
func workerMetric(t *testing.T, ctx context.Context, c *http.Client, w *up.Worker, name, result string) float64 {
	t.Helper()
	resp := send(t, ctx, c, "GET", "http://"+w.Addr+"/metrics", "")
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s /metrics: %v", w.ID, err)
	}
	var v float64
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "result" && l.GetValue() == result {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// statusJSON reads the admin listener's status.json.
func statusJSON(t *testing.T, ctx context.Context, c *http.Client, s *up.System) up.Status {
	t.Helper()
	resp := send(t, ctx, c, "GET", s.AdminURL()+"/kvgate/status.json", "")
	defer resp.Body.Close()
	var st up.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestDisaggregated drives a long prompt through the gateway of a
// disaggregated system: the disaggregate policy sends it to a decode
// worker naming the prefill worker, the decode mocker makes the sidecar's
// prefill hop and pulls the pinned blocks, and the client gets the decode
// worker's answer. Both workers show their part, both pools index the
// prompt, no router holds the request afterwards, and a second request
// with the same prefix is served by the same decode worker from the
// transferred blocks.
func TestDisaggregated(t *testing.T) {
	t.Parallel()
	s := startDisaggregated(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	prefill, decode := s.Pool(up.PrefillPool), s.Pool(up.DecodePool)
	pw := prefill.Workers[0]

	r := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt("disaggregation", 0), false, 4), "x-kvgate-explain", "1")
	if r.status != 200 || r.pool != up.DecodePool {
		t.Fatalf("first request: %d on pool %q: %s; want 200 on %s", r.status, r.pool, r.body, up.DecodePool)
	}
	if ex := r.header.Get("x-kvgate-explain"); !strings.Contains(ex, "prefill on "+up.PrefillPool+"/"+pw.ID) {
		t.Errorf("x-kvgate-explain does not show the prefill on %s:\n%s", pw.ID, ex)
	}
	var ans struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(r.body, &ans); err != nil || len(ans.Choices) != 1 || ans.Choices[0].Message.Content == "" ||
		ans.Usage.CompletionTokens != 4 || ans.Usage.PromptTokens < 512 || ans.KV != nil {
		t.Errorf("answer %s (%v): want the decode worker's 4 tokens of a ≥ 512-token prompt, no kv_transfer_params", r.body, err)
	}

	// The prefill worker computed the prompt and its pinned blocks were
	// pulled; the decode worker that answered pulled them, the other did
	// nothing.
	if st := pw.Stats(); st.PrefixQueryTokens < 512 || st.HeldBlocks != 0 || st.UsedBlocks != 0 {
		t.Errorf("prefill worker stats %+v: want the prompt prefilled and nothing held after the pull", st)
	}
	for _, w := range decode.Workers {
		pulls := workerMetric(t, ctx, c, w, "kvgate_mocker_pd_kv_pulls_total", "ok")
		hops := workerMetric(t, ctx, c, w, "kvgate_mocker_pd_prefill_requests_total", "ok")
		want := 0.0
		if w.ID == strings.TrimPrefix(r.worker, up.DecodePool+"/") || w.ID == r.worker {
			want = 1
			if st := w.Stats(); st.CachedBlocks < 512/16 {
				t.Errorf("decode worker %s caches %d blocks, want the pulled prompt's", w.ID, st.CachedBlocks)
			}
		}
		if pulls != want || hops != want {
			t.Errorf("decode worker %s: %v prefill hops, %v pulls; want %v each", w.ID, hops, pulls, want)
		}
	}

	// Both routers let the request go; both pools index the prompt.
	waitIdle(t, s)
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		st := statusJSON(t, ctx, c, s)
		for _, p := range st.Pools {
			if p.IndexBlocks == 0 || p.RequestsActive != 0 {
				return fmt.Sprintf("pool %s (%s): %d blocks indexed, %d requests active", p.Name, p.Role, p.IndexBlocks, p.RequestsActive), false
			}
		}
		return "", true
	})
	waitStreamsClosed(t, s)

	// The same prefix again: below the threshold uncached on the decode
	// worker that holds it, so served there, from the transferred blocks.
	r2 := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt("disaggregation", 1), false, 4), "x-kvgate-explain", "1")
	if r2.status != 200 || r2.pool != up.DecodePool || r2.worker != r.worker || r2.overlap < 512/16 {
		t.Errorf("second request: %d on %s/%s with %d overlap blocks; want 200 on %s with the prompt's blocks:\n%s",
			r2.status, r2.pool, r2.worker, r2.overlap, r.worker, r2.header.Get("x-kvgate-explain"))
	}
	if ex := r2.header.Get("x-kvgate-explain"); strings.Contains(ex, "prefill on") {
		t.Errorf("second request was disaggregated again:\n%s", ex)
	}
	waitIdle(t, s)
}

// TestDisaggregatedDeadPrefiller kills the prefill worker (its listener
// closes; it stays registered, as a crashed pod until its lease ends): a
// disaggregated request gets the decode worker's 502 naming the
// prefiller, as llm-d's sidecar answers, and no router keeps it.
func TestDisaggregatedDeadPrefiller(t *testing.T) {
	t.Parallel()
	s := startDisaggregated(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	pw := s.Pool(up.PrefillPool).Workers[0]
	pw.Kill()

	resp := postChat(t, ctx, c, s.GatewayURL(), chatBody("mock-llama", longPrompt("dead prefiller", 0), true, 4), "x-kvgate-explain", "1")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct {
		Error struct{ Message, Code string } `json:"error"`
	}
	json.Unmarshal(b, &e)
	if resp.StatusCode != http.StatusBadGateway || e.Error.Code != "prefill_failed" || !strings.Contains(e.Error.Message, pw.Addr) {
		t.Errorf("got %d %s; want 502 prefill_failed naming %s (explain: %s)", resp.StatusCode, b, pw.Addr, resp.Header.Get("x-kvgate-explain"))
	}
	waitIdle(t, s)
	waitStreamsClosed(t, s)

	// The prefill worker comes back on its address: once its pool's
	// router sees it again, disaggregated requests, streamed ones too,
	// succeed. (Completions of distinct prompts: nothing cached anywhere
	// tips the load-aware choice to a local prefill.)
	if err := pw.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	attempt := 0
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		attempt++
		body, _ := json.Marshal(map[string]any{"model": "mock-llama", "stream": true, "max_tokens": 4,
			"prompt": longPrompt(fmt.Sprint("restarted prefiller ", attempt), 0)})
		resp := send(t, ctx, c, "POST", s.GatewayURL()+"/v1/completions", string(body), "x-kvgate-explain", "1")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ex := resp.Header.Get("x-kvgate-explain")
		if resp.StatusCode != 200 || !strings.Contains(ex, "prefill on") {
			return fmt.Sprintf("after the restart: %d %s\n%s", resp.StatusCode, b, ex), false
		}
		if !strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]") {
			t.Errorf("disaggregated stream after the restart does not end with [DONE]: %s", b)
		}
		return "", true
	})
	if st := pw.Stats(); st.PrefixQueryTokens < 512 || st.HeldBlocks != 0 {
		t.Errorf("restarted prefill worker: %+v, want the prompt prefilled and pulled", st)
	}
	waitIdle(t, s)
	waitStreamsClosed(t, s)
}

// waitStreamsClosed polls until the ext_proc server has no stream open.
func waitStreamsClosed(t *testing.T, s *up.System) {
	t.Helper()
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		fams, err := s.Registry.Gather()
		if err != nil {
			return err.Error(), false
		}
		for _, f := range fams {
			if f.GetName() == "kvgate_extproc_streams_active" {
				if v := f.GetMetric()[0].GetGauge().GetValue(); v != 0 {
					return fmt.Sprintf("%v ext_proc streams open", v), false
				}
			}
		}
		return "", true
	})
}
