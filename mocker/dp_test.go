package mocker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// rankSink records the Stored events of one rank.
type rankSink struct {
	mu     sync.Mutex
	stored int
}

func (r *rankSink) PublishKV(_ context.Context, _ time.Time, evs []kvevents.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range evs {
		if ev.Stored != nil {
			r.stored++
		}
	}
	return nil
}

func (r *rankSink) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stored
}

func TestDataParallelRanks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sinks := []*rankSink{{}, {}}
	reg := prometheus.NewRegistry()
	srv, err := NewServer(ServerConfig{Model: "m", DPSize: 2, Engine: Config{BlockSize: 4, NumBlocks: 256, Speedup: 1000}},
		ServerOptions{Logger: testenv.Logger(t), Registry: reg, Sinks: []KVSink{sinks[0], sinks[1]}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	hs := ts.URL

	prompt := `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":2`
	tests := []struct {
		name     string
		header   map[string]string
		body     string
		status   int
		wantRank string
	}{
		{"vLLM's header spelling", map[string]string{"X-data-parallel-rank": "1"}, prompt + `}`, 200, "1"},
		{"SGLang's header spelling", map[string]string{"X-Data-Parallel-Rank": "0"}, prompt + `}`, 200, "0"},
		{"SGLang's body field", nil, prompt + `,"routed_dp_rank":1}`, 200, "1"},
		{"header wins over body", map[string]string{"x-data-parallel-rank": "0"}, prompt + `,"routed_dp_rank":1}`, 200, "0"},
		{"rank out of range", map[string]string{"x-data-parallel-rank": "2"}, prompt + `}`, 400, ""},
		{"negative body rank", nil, prompt + `,"routed_dp_rank":-1}`, 400, ""},
		{"non-integer header ignored, as vLLM does", map[string]string{"x-data-parallel-rank": "one"}, prompt + `,"routed_dp_rank":1}`, 200, "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(ctx, t, hs+"/v1/completions", tt.body, tt.header)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, tt.status)
			}
			if got := resp.Header.Get(HeaderServedDPRank); got != tt.wantRank {
				t.Errorf("%s = %q, want %q", HeaderServedDPRank, got, tt.wantRank)
			}
		})
	}
	// Each rank has its own cache: rank 1 served the prompt twice, its
	// second time from cache; its events went to its own sink.
	if a, b := srv.RankStats(0), srv.RankStats(1); a.PrefixQueryTokens == 0 || b.PrefixHitTokens == 0 {
		t.Errorf("rank stats %+v and %+v: want both queried and rank 1 hit", a, b)
	}
	if sinks[0].count() == 0 || sinks[1].count() == 0 {
		t.Errorf("stored events per rank = %d, %d; want both > 0", sinks[0].count(), sinks[1].count())
	}
	if len(srv.RankCachedBlocks(1)) == 0 {
		t.Error("rank 1 caches nothing")
	}

	// The metrics carry vLLM's engine label per rank.
	resp, err := http.Get(hs + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := signals.Parse(resp.Body, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].Engine != signals.EngineVLLM || !got[1].HasPrefixHitRate || got[1].PrefixHitRate == 0 {
		t.Errorf("scraped ranks %+v: want two vLLM ranks, rank 1 with hits", got)
	}
}

func TestDataParallelRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  ServerConfig
		opts ServerOptions
	}{
		{ServerConfig{DPSize: MaxDPSize + 1}, ServerOptions{}},
		{ServerConfig{DPSize: -1}, ServerOptions{}},
		{ServerConfig{DPSize: 2}, ServerOptions{Sink: &rankSink{}}},
		{ServerConfig{DPSize: 2}, ServerOptions{Sinks: []KVSink{&rankSink{}}}},
	} {
		if _, err := NewServer(tc.cfg, tc.opts); err == nil {
			t.Errorf("NewServer(dp_size %d, %d sinks) = nil error", tc.cfg.DPSize, len(tc.opts.Sinks))
		}
	}
}

// TestMetricsFollowLoad scrapes a real mocker with the local router's
// parser and sees running, waiting and KV usage rise under load, and the
// prefix hit rate once a prompt repeats.
func TestMetricsFollowLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// One sequence at a time and a real-GPU-like speed: a second request
	// waits while the first decodes.
	_, hs, _ := startServer(t, ServerConfig{Model: "m", Engine: Config{BlockSize: 4, NumBlocks: 512, MaxNumSeqs: 1, Speedup: 1}})
	scrape := func() signals.Sample {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, err := signals.Parse(resp.Body, 0, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	if idle := scrape(); idle.Running != 0 || idle.Waiting != 0 || idle.KVUsage != 0 {
		t.Fatalf("idle engine reports %+v", idle)
	}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"m","prompt":[` + strings.Repeat("7,", 40+i) + `1],"max_tokens":1000}`
			req, _ := http.NewRequestWithContext(lctx, http.MethodPost, hs.URL+"/v1/completions", strings.NewReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for {
		s := scrape()
		if s.Running == 1 && s.Waiting == 2 && s.KVUsage > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("never saw the load: last %+v", s)
		case <-time.After(5 * time.Millisecond):
		}
	}
	stopLoad()
	wg.Wait()
	for s := scrape(); s.Running != 0 || s.Waiting != 0; s = scrape() {
		select {
		case <-ctx.Done():
			t.Fatalf("load never drained: %+v", s)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The same prompt twice: the second is served from the prefix cache.
	for range 2 {
		resp := post(ctx, t, hs.URL+"/v1/completions", `{"model":"m","prompt":[`+strings.Repeat("3,", 31)+`3],"max_tokens":1}`, nil)
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
	}
	if s := scrape(); !s.HasPrefixHitRate || s.PrefixHitRate == 0 {
		t.Errorf("after a repeated prompt: %+v, want a prefix hit rate above 0", s)
	}
}
