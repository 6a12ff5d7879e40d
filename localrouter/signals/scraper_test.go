package signals

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recorder is a Sink that keeps the last call per worker.
type recorder struct {
	mu   sync.Mutex
	last map[string]map[uint32]Sample
	seen map[string]bool
}

func (r *recorder) SetEngineSignals(id string, ranks map[uint32]Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last, r.seen = map[string]map[uint32]Sample{}, map[string]bool{}
	}
	r.last[id], r.seen[id] = ranks, true
}

func (r *recorder) get(id string) (map[uint32]Sample, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.seen[id]
	return r.last[id], v && ok
}

func TestScraperRound(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Accept"), "text/plain") {
			t.Errorf("Accept = %q, want the text format", r.Header.Get("Accept"))
		}
		w.Write([]byte(vllmDP2))
	}))
	defer ok.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer broken.Close()
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(vllmDP2))
		w.Write([]byte(strings.Repeat("# padding comment\n", 1<<12)))
	}))
	defer huge.Close()

	targets := []Target{{"ok", ok.URL + "/metrics"}, {"broken", broken.URL}, {"huge", huge.URL}, {"down", "http://127.0.0.1:1/metrics"}}
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	s, err := NewScraper(ScraperOptions{
		Period: time.Second, Targets: func() []Target { mu.Lock(); defer mu.Unlock(); return targets },
		Sink: rec, MaxBytes: 16 << 10, Registerer: reg, Clock: func() time.Time { return at },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.Round(ctx)

	got, seen := rec.get("ok")
	if !seen || len(got) != 2 || got[0].Waiting != 2 || got[1].KVUsage != 0.25 {
		t.Errorf("ok worker: got %+v (seen %v), want vLLM's two ranks", got, seen)
	}
	for _, id := range []string{"broken", "huge", "down"} {
		if got, seen := rec.get(id); !seen || got != nil {
			t.Errorf("%s worker: got %+v (seen %v), want a nil call", id, got, seen)
		}
	}
	if st := s.Stats(); st.Scrapes != 4 || st.Failures != 3 {
		t.Errorf("stats = %+v, want 4 scrapes, 3 failures", st)
	}
	const golden = `# HELP kvgate_localrouter_engine_scrapes_total Scrapes of workers' engine metrics endpoints, by result (ok, error).
# TYPE kvgate_localrouter_engine_scrapes_total counter
kvgate_localrouter_engine_scrapes_total{result="error"} 3
kvgate_localrouter_engine_scrapes_total{result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(golden), "kvgate_localrouter_engine_scrapes_total"); err != nil {
		t.Error(err)
	}

	// A target that left gets its samples cleared.
	mu.Lock()
	targets = targets[1:2]
	mu.Unlock()
	s.Round(ctx)
	if got, _ := rec.get("ok"); got != nil {
		t.Errorf("ok worker after leaving: %+v, want nil", got)
	}
}

func TestNewScraperRefusesBadOptions(t *testing.T) {
	if _, err := NewScraper(ScraperOptions{Period: 0, Targets: func() []Target { return nil }, Sink: &recorder{}}); err == nil {
		t.Error("period 0: no error")
	}
	if _, err := NewScraper(ScraperOptions{Period: time.Second}); err == nil {
		t.Error("no targets or sink: no error")
	}
}
