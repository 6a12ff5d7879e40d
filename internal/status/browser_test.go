package status_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/kvgate/kvgate/internal/status"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/internal/uptest"
)

// chromium finds Debian's chromium (mk/chromium.mk installs it for make
// test). Without it the test skips under a bare `go test`, and fails when
// KVGATE_REQUIRE_TOOLS is set, as `make test` sets it: a check that make
// test runs never passes by skipping.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "no chromium on PATH (make test installs it: mk/chromium.mk)"
	if os.Getenv("KVGATE_REQUIRE_TOOLS") != "" {
		t.Fatal(msg + "; KVGATE_REQUIRE_TOOLS is set, so a missing tool fails the test")
	}
	t.Skip(msg)
	return ""
}

// artifacts is where the screenshot goes: $KVGATE_TEST_ARTIFACTS, or the
// test's temporary folder.
func artifacts(t *testing.T) string {
	if d := os.Getenv("KVGATE_TEST_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// scrape reads the samples of name from a Prometheus text exposition at
// url, summed over their labels.
func scrape(t *testing.T, ctx context.Context, url, name string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", url, line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		t.Fatalf("%s exposes no %s", url, name)
	}
	return sum
}

type shownWorker struct {
	Pool, ID, InFlight, KV, Cached, HitRate string
	Chart                                   bool
}

type shownPool struct {
	Name, State, InFlight, Decisions string
}

type shown struct {
	Workers   []shownWorker
	Pools     []shownPool
	Decisions int
	Updates   int
	Config    string
}

const readPage = `(() => {
  const txt = (el, f) => el.querySelector('[data-field="' + f + '"]').textContent.trim();
  return {
    Workers: Array.from(document.querySelectorAll('table.workers tr[data-worker]')).map(tr => ({
      Pool: tr.closest('table').dataset.pool, ID: tr.dataset.worker,
      InFlight: txt(tr, 'in-flight'), KV: txt(tr, 'kv-usage'), Cached: txt(tr, 'cached-blocks'), HitRate: txt(tr, 'hit-rate'),
      Chart: tr.querySelector('svg.chart') !== null })),
    Pools: Array.from(document.querySelectorAll('h2[id^="pool-"]')).map(h => ({
      Name: h.id.slice(5), State: txt(h, 'state'), InFlight: txt(h.nextElementSibling, 'pool-in-flight'), Decisions: txt(h.nextElementSibling, 'decisions') })),
    Decisions: document.querySelectorAll('#decisions tbody tr').length,
    Updates: Number(document.getElementById('live-indicator').dataset.updates || 0),
    Config: document.getElementById('config').textContent,
  };
})()`

// TestLivePageInChromium drives kvgate up's live status page in headless
// Chromium: the numbers it shows are the metrics' (the global router's
// registry, the workers' /metrics), it updates itself every second, it
// reads with JavaScript off, and a screenshot is saved.
func TestLivePageInChromium(t *testing.T) {
	exe := chromium(t)
	ctx := testenv.ContextWithTimeout(t, 2*time.Minute)
	s := uptest.Start(t, func(c *up.Config) {
		c.Speedup, c.NumBlocks = 50, 2048
		c.Pools = []up.PoolSpec{{Name: "pool-a", Workers: 2}, {Name: "pool-b", Workers: 1}}
	})

	// Traffic: a shared system prompt, so later requests hit the cache.
	system := strings.Repeat("You are a careful assistant who answers briefly. ", 20)
	for i := range 6 {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, up.DefaultConfig().Model, system, i)
		req, _ := http.NewRequestWithContext(ctx, "POST", s.GatewayURL()+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	// Every request freed on its local router.
	for _, p := range s.Pools {
		for p.Requests() != 0 {
			select {
			case <-ctx.Done():
				t.Fatalf("pool %s still has %d requests in flight", p.Name, p.Requests())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	s.Live.Sample(ctx)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000))
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	url := s.AdminURL() + "/kvgate/status/"
	if err := chromedp.Do(bctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS("#decisions")),
	); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	// The script replaced the live part at least twice: it polls.
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`Number(document.getElementById('live-indicator').dataset.updates || 0) >= 2`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the page did not update itself: %v", err)
	}
	got, err := chromedp.Run(bctx, chromedp.Evaluate[shown](readPage))
	if err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifacts(t), "status-page.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)
	js, _ := json.MarshalIndent(got, "", "  ")
	t.Logf("page shows: %s", js)

	if got.Updates < 2 {
		t.Errorf("the page updated %d times, want at least 2", got.Updates)
	}
	if got.Decisions != 6 {
		t.Errorf("%d decisions listed, want the 6 made", got.Decisions)
	}
	if !strings.Contains(got.Config, "model-match") {
		t.Errorf("configuration table lacks the chain: %q", got.Config)
	}
	// Pools: decisions are kvgate_globalrouter_decisions_total{outcome="ok"}.
	counts := status.DecisionCounts(s.Registry)
	if len(got.Pools) != 2 {
		t.Fatalf("%d pools shown, want 2", len(got.Pools))
	}
	total := 0.0
	for _, p := range got.Pools {
		if want := fmt.Sprintf("%.0f", counts[p.Name]); p.Decisions != want {
			t.Errorf("pool %s: page shows %s decisions, metrics say %s", p.Name, p.Decisions, want)
		}
		if p.InFlight != "0" || p.State != "ok" {
			t.Errorf("pool %s: in flight %s, state %s; want 0, ok", p.Name, p.InFlight, p.State)
		}
		total += counts[p.Name]
	}
	if total != 6 {
		t.Errorf("metrics count %v ok decisions, want 6", total)
	}
	// Workers: KV usage and hit rate are the engines' own metrics.
	if len(got.Workers) != 3 {
		t.Fatalf("%d workers shown, want 3", len(got.Workers))
	}
	anyHit := false
	for _, w := range got.Workers {
		var uw *up.Worker
		for _, p := range s.Pools {
			for _, x := range p.Workers {
				if x.ID == w.ID {
					uw = x
				}
			}
		}
		if uw == nil {
			t.Fatalf("page shows unknown worker %s", w.ID)
		}
		murl := "http://" + uw.Addr + "/metrics"
		kv := scrape(t, ctx, murl, "vllm:kv_cache_usage_perc")
		if want := fmt.Sprintf("%.1f%%", 100*kv); w.KV != want {
			t.Errorf("worker %s: KV usage %s, vllm:kv_cache_usage_perc says %s", w.ID, w.KV, want)
		}
		q, h := scrape(t, ctx, murl, "vllm:prefix_cache_queries_total"), scrape(t, ctx, murl, "vllm:prefix_cache_hits_total")
		want := "–"
		if q > 0 {
			want = fmt.Sprintf("%.1f%%", 100*h/q)
		}
		if w.HitRate != want {
			t.Errorf("worker %s: hit rate %s, the prefix-cache counters say %s (%v/%v)", w.ID, w.HitRate, want, h, q)
		}
		if h > 0 {
			anyHit = true
		}
		if want := strconv.Itoa(uw.Stats().CachedBlocks); w.Cached != want {
			t.Errorf("worker %s: cached blocks %s, the engine says %s", w.ID, w.Cached, want)
		}
		if w.InFlight != "0" || !w.Chart {
			t.Errorf("worker %s: in flight %s, chart %v; want 0 and a chart", w.ID, w.InFlight, w.Chart)
		}
	}
	if !anyHit {
		t.Error("no worker hit its prefix cache: the shared system prompt should have")
	}

	// JavaScript off: the server-rendered tables carry the same rows.
	jctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	scripts := func(disabled bool) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: disabled})
			return err
		})
	}
	if err := chromedp.Do(jctx,
		scripts(true),
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS("#decisions")),
		// Read it with scripts back on, without reloading: the page's own
		// script did not run.
		scripts(false),
	); err != nil {
		t.Fatalf("chromium without JavaScript: %v", err)
	}
	off, err := chromedp.Run(jctx, chromedp.Evaluate[shown](readPage))
	if err != nil {
		t.Fatal(err)
	}
	if len(off.Workers) != 3 || off.Decisions != 6 || off.Updates != 0 {
		t.Errorf("without JavaScript: %d workers, %d decisions, %d updates; want 3, 6, 0", len(off.Workers), off.Decisions, off.Updates)
	}
}
