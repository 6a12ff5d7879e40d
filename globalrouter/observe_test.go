package globalrouter_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestObserver: every decision reaches the observer with its explanation,
// also when the client may not see it; the last reload is reported.
func TestObserver(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	var mu sync.Mutex
	var seen []globalrouter.Observation
	r, _ := newRouter(t, c.cfg, globalrouter.WithObserver(func(o globalrouter.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, o)
	}))
	d, err := r.Decide(ctx, &globalrouter.Request{ID: "obs", Model: model, Prompt: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	if _, err := r.Decide(ctx, &globalrouter.Request{Model: "nope", Prompt: "hello"}); err == nil {
		t.Fatal("an unknown model was routed")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("%d observations, want 2", len(seen))
	}
	if o := seen[0]; o.Outcome != "ok" || o.RequestID != "obs" || o.Decision == nil || !strings.Contains(o.Explanation, "winner "+d.Primary.Pool) {
		t.Errorf("first observation %+v", o)
	}
	if d.Expose == false && d.Explanation != "" {
		t.Errorf("the explanation reached an unexposed decision: %q", d.Explanation)
	}
	if o := seen[1]; o.Outcome != "unknown_model" || o.Err == nil || o.Decision != nil {
		t.Errorf("second observation %+v", o)
	}
	if lr := r.LastReload(); lr.Time.IsZero() || lr.Err != nil {
		t.Errorf("last reload %+v, want New's, taken", lr)
	}
}

// TestObserverExplainsOnASample: for the observer alone, decisions are
// explained at most once per ObserverExplainInterval; a decision the client
// asks to explain always is.
func TestObserverExplainsOnASample(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	var mu sync.Mutex
	var seen []globalrouter.Observation
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	r, _ := newRouter(t, c.cfg, globalrouter.WithClock(clock), globalrouter.WithObserver(func(o globalrouter.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, o)
	}))
	decide := func(explain bool) {
		t.Helper()
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hello", Explain: explain})
		if err != nil {
			t.Fatal(err)
		}
		free(t, d)
	}
	decide(false) // explained: the first
	decide(false) // not: same instant
	decide(true)  // explained: asked for
	mu.Lock()
	now = now.Add(globalrouter.ObserverExplainInterval)
	mu.Unlock()
	decide(false) // explained: the interval passed
	mu.Lock()
	defer mu.Unlock()
	want := []bool{true, false, true, true}
	if len(seen) != len(want) {
		t.Fatalf("%d observations, want %d", len(seen), len(want))
	}
	for i, o := range seen {
		if got := o.Explanation != ""; got != want[i] {
			t.Errorf("observation %d: explained %v, want %v (%q)", i, got, want[i], o.Explanation)
		}
	}
}
