package localrouter

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/localrouter/signals"
)

// vllmTTFT is a scrape of one vLLM engine (rank 0) whose time to first
// token histogram holds count observations summing to sum seconds, in
// vLLM's exposition (vllm/v1/metrics/loggers.py at 005a810b,
// prometheus_client's text format; localrouter/signals/latency_test.go
// has every bucket), read by the scraper's own parser.
func vllmTTFT(t *testing.T, sum float64, count int, at time.Time) map[uint32]signals.Sample {
	t.Helper()
	body := fmt.Sprintf(`# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} %d.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} %d.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} %g
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
`, count, count, sum)
	smp, err := signals.Parse(strings.NewReader(body), 0, at)
	if err != nil {
		t.Fatal(err)
	}
	return smp
}

// histEngine drives one worker of r as an engine truth times slower than
// the prior would, scraped every scrapeEvery requests: each request is
// placed, its first token comes after its true time, the lifecycle
// reports it when lifecycle(i), and it is freed.
type histEngine struct {
	r             *Router
	now           *time.Time
	truth         TimingModel
	sum           float64
	count         int
	scrapeEvery   int
	lifecycle     func(i int) bool
	lifecycleSeen int
}

func (e *histEngine) run(t *testing.T, ctx context.Context, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if i%e.scrapeEvery == 0 {
			e.r.SetEngineSignals("w0", vllmTTFT(t, e.sum, e.count, *e.now))
		}
		id := fmt.Sprint("r", i)
		sel, err := e.r.BestWorker(ctx, uniqueRequest(i, 16+i%48), BestWorkerOptions{RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		ttft := trueTTFT(&e.truth, sel.ISL, DefaultTTFTChunk, false, 0)
		*e.now = e.now.Add(time.Duration(ttft * float64(time.Millisecond)))
		e.sum += ttft / 1000
		e.count++
		if e.lifecycle(i) {
			e.lifecycleSeen++
			if err := e.r.MarkPrefillComplete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.r.Free(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCalibrationFromHistograms: with no lifecycle samples at all (no
// first token reported), the engine's time to first token histogram
// calibrates the worker: its model predicts the true times, the report
// says the samples came from the histograms.
func TestCalibrationFromHistograms(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, now := calibRouter(t, 1, true)
	truth := scaled(defaultPrior(), 2, 2, 2, 0)
	e := &histEngine{r: r, now: now, truth: truth, scrapeEvery: 5, lifecycle: func(int) bool { return false }}
	e.run(t, ctx, 0, 400)
	c := r.CalibrationOf(WorkerKey{ID: "w0"})
	if !c.Fitted || !c.Histograms || c.HistogramSamples < 300 || c.Samples != c.HistogramSamples {
		t.Fatalf("calibration %+v: want fitted from the histograms alone (≥ 300 samples)", c)
	}
	// An aggregate of five requests informs the fit about their mean size
	// (640 tokens here) best: 5 % there, 10 % across the sizes seen.
	for _, tc := range []struct {
		isl int
		tol float64
	}{{256, 0.10}, {640, 0.05}, {1008, 0.10}} {
		got, want := trueTTFT(&c.Model, tc.isl, DefaultTTFTChunk, false, 0), trueTTFT(&truth, tc.isl, DefaultTTFTChunk, false, 0)
		if math.Abs(got-want)/want > tc.tol {
			t.Errorf("%d tokens: fitted prediction %.1f ms, want %.1f ± %g %%", tc.isl, got, want, 100*tc.tol)
		}
	}
	if c.EngineTTFTMs <= 0 {
		t.Errorf("engine TTFT interval mean %g, want > 0", c.EngineTTFTMs)
	}
}

// TestCalibrationHistogramsDeferToLifecycle: where the lifecycle reports
// every first token, the histograms add none (the lifecycle is primary);
// where it reports every other one, they add the others, each first token
// sampled once.
func TestCalibrationHistogramsDeferToLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name      string
		lifecycle func(int) bool
	}{
		{"all", func(int) bool { return true }},
		{"every other", func(i int) bool { return i%2 == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, now := calibRouter(t, 1, true)
			e := &histEngine{r: r, now: now, truth: scaled(defaultPrior(), 2, 2, 2, 0), scrapeEvery: 4, lifecycle: tc.lifecycle}
			e.run(t, ctx, 0, 200)
			r.SetEngineSignals("w0", vllmTTFT(t, e.sum, e.count, *now)) // the last interval
			c := r.CalibrationOf(WorkerKey{ID: "w0"})
			// The first scrape, before any request, is the baseline.
			if hist := 200 - e.lifecycleSeen; c.HistogramSamples != uint64(hist) || c.Samples != 200 {
				t.Errorf("samples %d, from histograms %d; want 200 and %d", c.Samples, c.HistogramSamples, hist)
			}
		})
	}
}

// TestCalibrationHistogramReset: totals that go down (the engine
// restarted) give no sample and start a new baseline.
func TestCalibrationHistogramReset(t *testing.T) {
	r, now := calibRouter(t, 1, true)
	ctx := context.Background()
	r.SetEngineSignals("w0", vllmTTFT(t, 100, 1000, *now))
	if _, err := r.BestWorker(ctx, uniqueRequest(1, 16), BestWorkerOptions{RequestID: "a"}); err != nil {
		t.Fatal(err)
	}
	*now = now.Add(time.Second)
	r.SetEngineSignals("w0", vllmTTFT(t, 0.5, 1, *now)) // restarted: one first token since
	if c := r.CalibrationOf(WorkerKey{ID: "w0"}); c.HistogramSamples != 0 {
		t.Fatalf("a restart gave %d samples, want 0", c.HistogramSamples)
	}
	*now = now.Add(time.Second)
	r.SetEngineSignals("w0", vllmTTFT(t, 1, 2, *now)) // the new baseline's next interval
	if c := r.CalibrationOf(WorkerKey{ID: "w0"}); c.HistogramSamples != 1 || c.EngineTTFTMs != 500 {
		t.Fatalf("after the restart: %d samples, TTFT mean %g ms; want 1 and 500", c.HistogramSamples, c.EngineTTFTMs)
	}
}

// TestCalibrationHistogramsBypass: where the lifecycle reports every first
// token of the router's placements, first tokens of load that bypassed
// the router (in the engine's histogram, not placed) take no placement
// still awaiting its own first token.
func TestCalibrationHistogramsBypass(t *testing.T) {
	ctx := context.Background()
	r, now := calibRouter(t, 1, true)
	r.SetEngineSignals("w0", vllmTTFT(t, 0, 0, *now))
	for _, id := range []string{"a", "b"} {
		if _, err := r.BestWorker(ctx, uniqueRequest(len(id), 16), BestWorkerOptions{RequestID: id}); err != nil {
			t.Fatal(err)
		}
	}
	*now = now.Add(100 * time.Millisecond)
	if err := r.MarkPrefillComplete(ctx, "a"); err != nil { // a's first token, reported
		t.Fatal(err)
	}
	// The engine counted a's first token and three of requests it was
	// sent directly; b's is still to come.
	r.SetEngineSignals("w0", vllmTTFT(t, 0.4, 4, *now))
	c := r.CalibrationOf(WorkerKey{ID: "w0"})
	if c.HistogramSamples != 0 || c.Samples != 1 {
		t.Fatalf("samples %d, from histograms %d; want a's alone, from the lifecycle", c.Samples, c.HistogramSamples)
	}
	*now = now.Add(100 * time.Millisecond)
	if err := r.MarkPrefillComplete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if c := r.CalibrationOf(WorkerKey{ID: "w0"}); c.Samples != 2 {
		t.Errorf("samples %d after b's first token, want 2: b's placement was kept for it", c.Samples)
	}
}
