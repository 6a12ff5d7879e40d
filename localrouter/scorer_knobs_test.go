package localrouter

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestUnreadNamesEverySilentKnob: each router setting the worker chain
// does not read is named with who reads it and the running chain; a
// setting the chain reads is not.
func TestUnreadNamesEverySilentKnob(t *testing.T) {
	chain := func(s string) []ScorerSpec {
		specs, err := ParseWorkerChain(s)
		if err != nil {
			t.Fatal(err)
		}
		return specs
	}
	tests := []struct {
		name    string
		mod     func(*Config)
		scraped bool
		want    []string // one substring per line, in order
	}{
		{"defaults", nil, false, nil},
		{"credit and scale under the default chain", func(c *Config) { c.OverlapScoreCredit, c.PrefillLoadScale = 0.5, 2 }, true, []string{
			"overlap_score_credit (--router-overlap-score-credit, DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT) = 0.5 is read by the `cost` scorer only; this router's chain is saturation,ttft=1",
			"prefill_load_scale (--router-prefill-load-scale, DYN_ROUTER_PREFILL_LOAD_SCALE) = 2 is read by the `cost` scorer only",
		}},
		{"credit under the cost chain", func(c *Config) { c.OverlapScoreCredit, c.WorkerChain = 0.5, CostWorkerChain() }, false, nil},
		{"credit replaced by the cost scorer's argument", func(c *Config) { c.OverlapScoreCredit, c.WorkerChain = 0.5, chain("cost/credit=2") }, false, []string{
			"= 0.5 is replaced by the chain's cost argument credit=2",
		}},
		{"engine weights", func(c *Config) { c.WaitingWeight, c.KVUsageWeight = 1, 10 }, true, []string{
			"waiting_weight (--router-waiting-weight) = 1 is read by the `cost` scorer only",
			"kv_usage_weight (--router-kv-usage-weight) = 10 is read by the `cost` scorer only",
		}},
		{"engine weights under cost, not scraped", func(c *Config) { c.WaitingWeight, c.WorkerChain = 1, CostWorkerChain() }, false, []string{
			"waiting_weight (--router-waiting-weight) = 1 needs the workers' engine metrics, which this router does not scrape",
		}},
		{"engine weights under cost, scraped", func(c *Config) { c.WaitingWeight, c.WorkerChain = 1, CostWorkerChain() }, true, nil},
		{"track_active_blocks", func(c *Config) { c.TrackActiveBlocks = false }, true, []string{"track_active_blocks (--router-track-active-blocks) = false is read by the `cost` scorer only"}},
		{"saturation without the filter", func(c *Config) { c.SaturationWaiting, c.WorkerChain = 4, chain("ttft") }, true, []string{
			"saturation_waiting (--router-saturation-waiting) = 4 is read by the `saturation` filter only; this router's chain is ttft",
		}},
		{"saturation not scraped", func(c *Config) { c.SaturationKVUsage = 0.9 }, false, []string{
			"saturation_kv_usage (--router-saturation-kv-usage) = 0.9 needs the workers' engine metrics",
		}},
		{"engine scorers not scraped", func(c *Config) { c.WorkerChain = chain("prefix,waiting,kv-usage") }, false, []string{
			`worker chain entry "waiting" reads the workers' engine metrics, which this router does not scrape (--router-metrics-period 0): it scores every worker 0`,
			`worker chain entry "kv-usage" reads`,
		}},
		{"engine scorers scraped", func(c *Config) { c.WorkerChain = chain("prefix,waiting,kv-usage") }, true, nil},
		{"ttl with KV events", func(c *Config) { c.TTL = time.Minute }, true, []string{"ttl (--router-ttl) = 1m0s is read by the approximate index only"}},
		{"ttl, approximate", func(c *Config) { c.TTL, c.UseKVEvents = time.Minute, false }, true, nil},
		{"predicted ttl, approximate", func(c *Config) { c.PredictedTTL, c.UseKVEvents = 0, false }, true, []string{"predicted_ttl (--router-predicted-ttl) = 0s is read with KV events only"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.mod != nil {
				tt.mod(&cfg)
			}
			got := cfg.Unread(tt.scraped)
			if len(got) != len(tt.want) {
				t.Fatalf("Unread = %q, want %d lines", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("line %d: %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestOverrideUnreadIsLoggedOnce: a request's credit override under a
// chain without the cost scorer changes nothing, and the router says so,
// once; under the cost chain it takes effect and nothing is logged.
func TestOverrideUnreadIsLoggedOnce(t *testing.T) {
	credit := 0.0
	for _, tt := range []struct {
		chain string
		warns int
	}{{"", 1}, {"cost", 0}} {
		var buf bytes.Buffer
		cfg := DefaultConfig()
		cfg.BlockSize = 4
		if tt.chain != "" {
			cfg.WorkerChain = CostWorkerChain()
		}
		r, err := New(cfg, Options{SweepInterval: -1, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		r.AddWorker("a", 1)
		for range 3 {
			if _, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 1)}, BestWorkerOptions{Override: &routing.Override{OverlapScoreCredit: &credit}}); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Count(buf.String(), "is read by the `cost` scorer only"); got != tt.warns {
			t.Errorf("chain %q: %d warnings, want %d; log:\n%s", tt.chain, got, tt.warns, buf.String())
		}
	}
}

// TestSessionUnreadIsLoggedOnce: a request's session key under a chain
// without the session scorer is ignored, and the router says so, once;
// under a chain with it nothing is logged.
func TestSessionUnreadIsLoggedOnce(t *testing.T) {
	for _, tt := range []struct {
		chain string
		warns int
	}{{"", 1}, {"ttft,session", 0}} {
		var buf bytes.Buffer
		cfg := DefaultConfig()
		cfg.BlockSize = 4
		if tt.chain != "" {
			specs, err := ParseWorkerChain(tt.chain)
			if err != nil {
				t.Fatal(err)
			}
			cfg.WorkerChain = specs
		}
		r, err := New(cfg, Options{SweepInterval: -1, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		r.AddWorker("a", 1)
		for range 3 {
			if _, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(16, 1), SessionKey: "s1"}, BestWorkerOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Count(buf.String(), "is read by the `session` scorer only"); got != tt.warns {
			t.Errorf("chain %q: %d warnings, want %d; log:\n%s", tt.chain, got, tt.warns, buf.String())
		}
	}
}
