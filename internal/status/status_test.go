package status_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/status"
)

// fakeSource is the page's one seam: a Source whose counters the test
// moves.
type fakeSource struct {
	mu          sync.Mutex
	query, hits int64
}

func (f *fakeSource) add(q, h int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.query, f.hits = f.query+q, f.hits+h
}

func (f *fakeSource) snapshot(context.Context) status.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return status.Snapshot{
		Title: "test <page>",
		Info:  []status.Fact{{Label: "gateway", Value: "http://127.0.0.1:1"}},
		Pools: []status.Pool{{Name: "pool-a", Role: "aggregated", State: "circuit open", InFlight: 3, Decisions: 7,
			Routers: []status.Router{{Address: "127.0.0.1:2", Circuit: "open", Failures: 2}},
			Workers: []status.Worker{{ID: "w0", Address: "127.0.0.1:3", InFlight: 2, KVUsage: 0.25, CachedBlocks: 42, PrefixQueryTokens: f.query, PrefixHitTokens: f.hits}}}},
		Config: status.ConfigInfo{File: "pools.yaml", Chain: []string{"model-match", "cost"}, LastReload: time.Unix(0, 0), ReloadError: "pools.yaml:3:1: bad", FlowControl: "bands high > default"},
		Flow:   []status.FlowBand{{Pools: "pool-a", Band: "high", Requests: 5, Bytes: 900, Flows: "a: 4, none: 1"}},
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

func TestPageServerRendered(t *testing.T) {
	src := &fakeSource{}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	step := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	rec := status.NewRecorder(2)
	p := status.New(status.Options{Source: src.snapshot, Recorder: rec, SampleEvery: time.Second, Window: 10 * time.Second, Now: clock})
	ctx := context.Background()
	p.Sample(ctx)
	src.add(100, 50) // 50 %
	step(time.Second)
	p.Sample(ctx)
	src.add(100, 100) // 100 %, live (not sampled yet)
	step(time.Second)

	for i := range 3 {
		d := &globalrouter.Decision{Primary: globalrouter.Endpoint{Pool: "pool-a", Selection: routing.Selection{WorkerID: "w0", OverlapBlocks: i}}, RequestBlocks: 4, Explanation: fmt.Sprintf("why %d <b>", i)}
		rec.Observe(globalrouter.Observation{Time: now, RequestID: fmt.Sprintf("r%d", i), Model: "m", Outcome: "ok", Decision: d, Duration: 150 * time.Microsecond})
	}
	rec.Observe(globalrouter.Observation{Time: now, RequestID: "bad", Outcome: "no_pool", Err: errors.New("no pool reachable")})

	srv := httptest.NewServer(p.Handler("/kvgate/status"))
	defer srv.Close()
	page := get(t, srv.URL+"/kvgate/status/")
	for _, want := range []string{
		"<title>test &lt;page&gt;</title>",
		`<td data-field="in-flight">2</td>`, `<td data-field="kv-usage">25.0%</td>`, `<td data-field="cached-blocks">42</td>`,
		`<td data-field="hit-rate">75.0%</td>`, // 150 hits of 200 queries over the window
		`<b data-field="pool-in-flight">3</b>`, `<span data-field="decisions">7</span>`,
		`class="bad" data-field="state">circuit open</span>`, "circuit <span class=\"bad\">open</span> (2 failures)",
		"<svg class=\"chart\"", "<polyline", ">100 %</text>", ">0 %</text>", ">now</text>", // the chart's scale
		"explained on a sample: at most one decision every 10ms",
		"why 2 &lt;b&gt;", "no pool reachable", "model-match → cost", "refused: pools.yaml:3:1: bad",
		"<noscript>", `fetch("fragment"`,
		`<tr data-band="high"><td class="l">pool-a</td><td class="l">high</td><td data-field="flow-waiting">5</td><td>900</td><td class="l">a: 4, none: 1</td></tr>`,
		"bands high &gt; default",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// The recorder keeps the last 2, newest first.
	if strings.Contains(page, "why 1") || strings.Contains(page, "why 0") || strings.Index(page, "no pool reachable") > strings.Index(page, "why 2") {
		t.Error("the recorder did not keep exactly the last two decisions, newest first")
	}
	if strings.Contains(page, "http://") && !strings.Contains(page, "127.0.0.1:1") {
		t.Error("page refers to an external asset")
	}
	for _, bad := range []string{"<script src", "<link ", "@import", "url("} {
		if strings.Contains(page, bad) {
			t.Errorf("page loads an external asset (%q)", bad)
		}
	}
	frag := get(t, srv.URL+"/kvgate/status/fragment")
	if strings.Contains(frag, "<html") || !strings.Contains(frag, `data-field="cached-blocks">42`) {
		t.Errorf("fragment is not the live part alone:\n%s", frag)
	}
	var snap status.Snapshot
	if err := json.Unmarshal([]byte(get(t, srv.URL+"/kvgate/status/status.json")), &snap); err != nil {
		t.Fatal(err)
	}
	w := snap.Pools[0].Workers[0]
	if len(w.History) != 2 || w.History[0].HitRate != 0.5 || w.History[1].HitRate != 1 || w.HitRate != 0.75 || len(snap.Decisions) != 2 {
		t.Errorf("status.json: history %+v, hit rate %v, %d decisions", w.History, w.HitRate, len(snap.Decisions))
	}
}

func TestHistoryWindowAndRestart(t *testing.T) {
	src := &fakeSource{}
	now := time.Unix(0, 0)
	p := status.New(status.Options{Source: src.snapshot, SampleEvery: time.Second, Window: 3 * time.Second, Now: func() time.Time { return now }})
	ctx := context.Background()
	for range 10 {
		src.add(10, 0)
		p.Sample(ctx)
		now = now.Add(time.Second)
	}
	s := p.Snapshot(ctx)
	if n := len(s.Pools[0].Workers[0].History); n != 4 {
		t.Errorf("%d samples after the window, want 4 (3 s of 1 s samples, and the live one)", n)
	}
	if hr := s.Pools[0].Workers[0].HitRate; hr != 0 {
		t.Errorf("hit rate %v, want 0", hr)
	}
	// An engine restart resets its counters: the interval counts afresh,
	// never negative.
	src.mu.Lock()
	src.query, src.hits = 4, 4
	src.mu.Unlock()
	s = p.Snapshot(ctx)
	h := s.Pools[0].Workers[0].History
	if last := h[len(h)-1].HitRate; last != 1 {
		t.Errorf("after a counter reset the last interval's hit rate is %v, want 1", last)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	src := &fakeSource{}
	p := status.New(status.Options{Source: src.snapshot, SampleEvery: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10 s after its context was cancelled")
	}
}
