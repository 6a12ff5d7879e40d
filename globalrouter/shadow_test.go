package globalrouter_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/tokenizer"
)

// logBuffer is a slog destination safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// shadowCount is kvgate_shadow_decisions_total{agree}.
func shadowCount(t *testing.T, reg *prometheus.Registry, agree string) float64 {
	t.Helper()
	return testutil.ToFloat64(mustCounter(t, reg, "kvgate_shadow_decisions_total", agree))
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// shadowConfigText is pool-a and pool-b, pool-b in failover tier 1; the
// live chain lets kv-overlap decide, the candidate lets failover decide.
func shadowConfigText(c *cluster, shadow string) string {
	return "probe: {timeout: 10s}\nchain: [model-match, failover, kv-overlap]\n" + shadow + `pools:
  - name: pool-a
    models: [` + model + `]
    routers: {static: ["` + c.a.Addr + `"]}
  - name: pool-b
    models: [` + model + `]
    routers: {static: ["` + c.b.Addr + `"]}
    policy_file: b.yaml
`
}

func TestShadowMode(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	dir := write(t, map[string]string{
		"pools.yaml": shadowConfigText(c, "shadow:\n  chain: [model-match, kv-overlap, failover]\n  log_interval: 1h\n"),
		"b.yaml":     "failover: {tier: 1}\n",
	})
	cfg, err := globalrouter.LoadConfig(filepath.Join(dir, "pools.yaml"), builtins(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.ShadowChain(), " "); got != "model-match kv-overlap failover" {
		t.Errorf("shadow chain %q", got)
	}
	var logs logBuffer
	r, reg := newRouter(t, *cfg, globalrouter.WithLogger(logs.logger()))

	// Nothing cached: both chains keep pool-a (tier 0, first) and its best
	// worker.
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hello there"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Primary.Pool != "pool-a" {
		t.Fatalf("live chose %s, want pool-a", d.Primary.Pool)
	}
	free(t, d)
	waitFor(ctx, t, "one agreeing shadow decision", func() bool { return shadowCount(t, reg, "true") == 1 })

	// b-1 caches the prompt: the live chain (kv-overlap last) goes there,
	// the candidate (failover last) would stay on pool-a.
	msgs := chat(longText(200))
	toks := chatTokens(t, msgs)
	c.b.Store(t, "b-1", toks)
	for i := range 3 {
		d, err := r.Decide(ctx, &globalrouter.Request{ID: "req-" + string(rune('0'+i)), Model: model, Chat: tokenizer.NewChat(msgs...)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Primary.Pool != "pool-b" || d.Primary.WorkerID != "b-1" {
			t.Fatalf("live chose %s/%s, want pool-b/b-1: the shadow must not change the decision", d.Primary.Pool, d.Primary.WorkerID)
		}
		defer free(t, d)
	}
	waitFor(ctx, t, "three disagreeing shadow decisions", func() bool { return shadowCount(t, reg, "false") == 3 })
	if got := shadowCount(t, reg, "true"); got != 1 {
		t.Errorf("agreeing shadow decisions = %v, want 1", got)
	}
	// The shadow never commits: pool-a holds nothing.
	if err := c.b.WaitActive(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if n := c.a.ActiveRequests(); n != 0 {
		t.Errorf("pool-a has %d active requests: the shadow chain committed", n)
	}
	// Overlap difference: 0 once, -blocks three times.
	blocks := float64(len(toks) / 16)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvgate_shadow_overlap_difference_blocks" {
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 4 || h.GetSampleSum() != -3*blocks {
				t.Errorf("overlap difference: %d samples summing to %v, want 4 summing to %v", h.GetSampleCount(), h.GetSampleSum(), -3*blocks)
			}
		}
	}
	// One log line per interval (1h): one disagreement logged of three,
	// with both choices and their overlaps.
	out := logs.String()
	if n := strings.Count(out, "shadow chain disagrees"); n != 1 {
		t.Errorf("%d disagreement log lines, want 1 (rate-limited):\n%s", n, out)
	}
	for _, want := range []string{"live=pool-b", "live_worker_id=b-1", "shadow=pool-a", "live_overlap_blocks=", "shadow_overlap_blocks=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestShadowConfigErrors(t *testing.T) {
	c := newCluster(t)
	for _, tt := range []struct {
		name, shadow, want string
	}{
		{"unknown policy", "shadow:\n  chain: [model-match, nope]\n", `pools.yaml:4:24: shadow chain: unknown policy "nope"`},
		{"unknown field", "shadow:\n  chian: [cost]\n", `pools.yaml:4:3: shadow: unknown field "chian"`},
		{"empty chain", "shadow: {log_interval: 1s}\n", `shadow: the candidate chain is empty`},
		{"bad args", "shadow:\n  chain:\n    - name: disaggregate\n      args: {threshold: 1}\n", `pools.yaml:6:14: shadow policy "disaggregate": unknown field "threshold"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := write(t, map[string]string{"pools.yaml": shadowConfigText(c, tt.shadow), "b.yaml": "failover: {tier: 1}\n"})
			_, err := globalrouter.LoadConfig(filepath.Join(dir, "pools.yaml"), builtins(t))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("LoadConfig: got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestWatchReferencedFiles: editing a pool's policy file or the shadow file
// reloads; a bad one is refused, counted and logged, and the old
// configuration kept.
func TestWatchReferencedFiles(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	dir := write(t, map[string]string{
		"pools.yaml":  shadowConfigText(c, ""),
		"b.yaml":      "failover: {tier: 1}\n",
		"shadow.yaml": "chain: [model-match, cost]\n",
	})
	path := filepath.Join(dir, "pools.yaml")
	cfg, err := globalrouter.LoadConfig(path, builtins(t))
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	r, reg := newRouter(t, *cfg, globalrouter.WithLogger(logs.logger()), globalrouter.WithShadowFile(filepath.Join(dir, "shadow.yaml")))
	if got := strings.Join(r.Config().ShadowChain(), " "); got != "model-match cost" {
		t.Fatalf("shadow chain from the shadow file: %q", got)
	}
	results := watchFile(t, ctx, r, path, 8)
	next := func(what string) error {
		t.Helper()
		select {
		case err := <-results:
			return err
		case <-ctx.Done():
			t.Fatalf("WatchFile did not notice %s", what)
			return nil
		}
	}
	refused := func() float64 {
		return testutil.ToFloat64(mustCounter(t, reg, "kvgate_globalrouter_config_reloads_total", "refused"))
	}
	tier := func() string {
		sec := r.Config().Pools[1].Policy["failover"]
		return sec.Node.Content[1].Value
	}

	// A bad policy file: refused, counted, logged; the old one stays.
	replace(t, filepath.Join(dir, "b.yaml"), "failover: {tier: 1, teir: 2}\n")
	if err := next("the bad policy file"); err == nil || !strings.Contains(err.Error(), `b.yaml:1:21: pool "pool-b": policy "failover": unknown field "teir"`) {
		t.Fatalf("reload of a bad policy file: got %v", err)
	}
	if got := refused(); got != 1 {
		t.Errorf("refused reloads = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "configuration refused; keeping the current one") || !strings.Contains(logs.String(), "teir") {
		t.Errorf("no log line of the refusal:\n%s", logs.String())
	}
	if got := tier(); got != "1" {
		t.Errorf("pool-b's failover tier after a refused reload = %s, want the old 1", got)
	}
	// Fixed: reloaded.
	replace(t, filepath.Join(dir, "b.yaml"), "failover: {tier: 2}\n")
	if err := next("the fixed policy file"); err != nil {
		t.Fatalf("reload of a good policy file: %v", err)
	}
	if got := tier(); got != "2" {
		t.Errorf("pool-b's failover tier after the reload = %s, want 2", got)
	}
	// The shadow file: a bad one refused, a good one taken.
	replace(t, filepath.Join(dir, "shadow.yaml"), "chain: [model-match, nope]\n")
	if err := next("the bad shadow file"); err == nil || !strings.Contains(err.Error(), `shadow.yaml:1:22: shadow chain: unknown policy "nope"`) {
		t.Fatalf("reload of a bad shadow file: got %v", err)
	}
	if got := refused(); got != 2 {
		t.Errorf("refused reloads = %v, want 2", got)
	}
	replace(t, filepath.Join(dir, "shadow.yaml"), "chain: [model-match, kv-overlap]\n")
	if err := next("the good shadow file"); err != nil {
		t.Fatalf("reload of a good shadow file: %v", err)
	}
	if got := strings.Join(r.Config().ShadowChain(), " "); got != "model-match kv-overlap" {
		t.Errorf("shadow chain after the reload: %q", got)
	}
	// A policy file deleted is a change too: refused, the old kept.
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := next("the deleted policy file"); err == nil {
		t.Fatal("reload without the policy file was taken")
	}
}

// BenchmarkDecideShadow is a decision with and without a shadow chain: the
// live path pays for starting the shadow's goroutine only.
func BenchmarkDecideShadow(b *testing.B) {
	ctx := testenv.Context(b)
	c := newCluster(b)
	for _, shadow := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[shadow], func(b *testing.B) {
			cfg := c.cfg
			if shadow {
				cfg.Shadow = &globalrouter.ShadowConfig{Chain: []policies.Spec{{Name: "model-match"}, {Name: "kv-overlap"}}}
			}
			r, _ := newRouter(b, cfg)
			msgs := chat(longText(100))
			b.ReportAllocs()
			for b.Loop() {
				d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...)})
				if err != nil {
					b.Fatal(err)
				}
				_ = d.Lease.Free(ctx)
			}
		})
	}
}

// TestWatchTokenizerFiles: a model's chat template is watched too.
func TestWatchTokenizerFiles(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	models := "models:\n  - name: " + model + "\n    tokenizer: {backend: openai, encoding: cl100k_base, chat_template: t.jinja}\n"
	dir := write(t, map[string]string{
		"pools.yaml": strings.Replace(shadowConfigText(c, ""), "pools:\n", models+"pools:\n", 1),
		"b.yaml":     "failover: {tier: 1}\n",
		"t.jinja":    "{% for m in messages %}{{ m.content }}{% endfor %}",
	})
	path := filepath.Join(dir, "pools.yaml")
	if got := globalrouter.ReferencedFiles(path, []byte(strings.Replace(shadowConfigText(c, ""), "pools:\n", models+"pools:\n", 1))); len(got) != 2 {
		t.Fatalf("referenced files %v, want b.yaml and t.jinja", got)
	}
	cfg, err := globalrouter.LoadConfig(path, builtins(t))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := newRouter(t, *cfg)
	results := watchFile(t, ctx, r, path, 4)
	replace(t, filepath.Join(dir, "t.jinja"), "{% for m in messages %}[{{ m.content }}]{% endfor %}")
	select {
	case err := <-results:
		if err != nil {
			t.Fatalf("reload after the template changed: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("WatchFile did not notice the chat template change")
	}
}

// watchFile runs r.WatchFile on path (every 5 ms) until the test ends and
// returns the channel of its reload results (buffered n); WatchFile's own
// error fails the test.
func watchFile(t *testing.T, ctx context.Context, r *globalrouter.Router, path string, n int) <-chan error {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	results := make(chan error, n)
	done := make(chan error, 1)
	go func() { done <- r.WatchFile(wctx, path, 5*time.Millisecond, func(err error) { results <- err }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchFile: %v", err)
		}
	})
	return results
}
