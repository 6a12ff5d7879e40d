package localrouter

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter/signals"
	"github.com/kvgate/kvgate/mocker"
)

// TestCalibrationFromMockerHistograms: a real mocker (its /metrics under
// vLLM's names and bucket layouts) scraped by the real scraper into the
// router: requests placed on it whose first tokens the lifecycle never
// reports are each sampled once from the engine's time to first token
// histogram.
func TestCalibrationFromMockerHistograms(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	eng, err := mocker.NewServer(mocker.ServerConfig{Model: "m", WorkerID: "w0", Engine: mocker.Config{Speedup: 1000}},
		mocker.ServerOptions{Logger: testenv.Logger(t), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); eng.Run(runCtx) }()
	hs := httptest.NewServer(eng.Handler())
	defer func() { hs.Close(); stop(); <-done }()

	r, err := New(DefaultConfig(), Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.AddWorker("w0", 1)
	sc, err := signals.NewScraper(signals.ScraperOptions{Period: time.Hour, Sink: r,
		Targets: func() []signals.Target { return []signals.Target{{ID: "w0", URL: hs.URL + "/metrics"}} }})
	if err != nil {
		t.Fatal(err)
	}
	sc.Round(ctx) // the baseline
	const n = 30
	for i := range n {
		id := fmt.Sprint("r", i)
		if _, err := r.BestWorker(ctx, uniqueRequest(i, 8), BestWorkerOptions{RequestID: id}); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":"request %d says hello","max_tokens":2}`, i)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion %d: status %d", i, resp.StatusCode)
		}
		if err := r.Free(ctx, id); err != nil { // no MarkPrefillComplete: the lifecycle saw no first token
			t.Fatal(err)
		}
		if i%7 == 6 {
			sc.Round(ctx)
		}
	}
	sc.Round(ctx)
	if st := sc.Stats(); st.Failures != 0 {
		t.Fatalf("scrapes failed: %+v", st)
	}
	c := r.CalibrationOf(WorkerKey{ID: "w0"})
	if !c.Histograms || c.HistogramSamples != n || c.Samples != n || c.EngineTTFTMs <= 0 || c.EngineITLMs <= 0 {
		t.Errorf("calibration %+v: want %d samples, all from the engine's histograms, and its interval means", c, n)
	}
}
