package localrouter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// trueTTFT is the first token's time under model m of a request whose
// prefill work is work tokens in chunks of chunk, decoding at occupancy p
// when decoding: the scorer's prediction under m.
func trueTTFT(m *TimingModel, work, chunk int, decoding bool, p float64) float64 {
	n := (work + chunk - 1) / chunk
	ms := float64(n-1)*m.Prefill(chunk) + m.Prefill(work-(n-1)*chunk) + m.QueueMs
	if decoding {
		ms += float64(n) * m.Decode(p)
	}
	return ms
}

// calibFeatures builds the samples' features as ttftScorer.features does,
// for the prior of a scorer at the default arguments.
func calibFeatures(prior *TimingModel, work, chunk int, decoding bool, p float64) ([calibParams]float64, float64) {
	n := (work + chunk - 1) / chunk
	c, r := float64(chunk), float64(work-(n-1)*chunk)
	var x [calibParams]float64
	x[0] = prior.PrefillQuad * (float64(n-1)*c*c + r*r)
	x[1] = prior.PrefillLinear*float64(work) + prior.PrefillFixed*float64(n)
	if decoding {
		x[2] = float64(n) * prior.Decode(p)
	}
	x[3] = calibQueueUnit
	return x, x[0] + x[1] + x[2]
}

func defaultPrior() TimingModel {
	return defaultTimingModel(1, DefaultTTFTDecodeEmptyMillis, DefaultTTFTDecodeFullMillis)
}

// scaled is prior with its prefill quadratic, prefill linear and decode
// curves multiplied by q, l and d, plus queue ms.
func scaled(prior TimingModel, q, l, d, queue float64) TimingModel {
	return TimingModel{PrefillQuad: prior.PrefillQuad * q, PrefillLinear: prior.PrefillLinear * l, PrefillFixed: prior.PrefillFixed * l,
		DecodeQuad: prior.DecodeQuad * d, DecodeLinear: prior.DecodeLinear * d, DecodeFixed: prior.DecodeFixed * d, QueueMs: queue}
}

// feed gives f n synthetic samples of engine truth: work from 64 to 40,000
// tokens, decoding at a random occupancy half the time, the observed time
// multiplied by 1 + noise·N(0,1) and, with probability outliers, by 10.
func feed(f *rls, prior, truth *TimingModel, rng *rand.Rand, n int, noise, outliers float64) {
	for range n {
		work := 64 + rng.IntN(40_000)
		decoding := rng.IntN(2) == 0
		p := rng.Float64()
		x, scale := calibFeatures(prior, work, DefaultTTFTChunk, decoding, p)
		y := trueTTFT(truth, work, DefaultTTFTChunk, decoding, p) * math.Max(0.05, 1+noise*rng.NormFloat64())
		if rng.Float64() < outliers {
			y *= 10
		}
		f.update(x, y, scale)
	}
}

// relErrors are the fit's largest and mean relative errors against truth
// over a grid of requests.
func relErrors(f *rls, prior, truth *TimingModel) (worst, mean float64) {
	m := f.model(prior)
	n := 0
	for _, work := range []int{500, 1000, 4000, 8192, 12_000, 30_000} {
		for _, p := range []float64{-1, 0.1, 0.5, 0.9} {
			want := trueTTFT(truth, work, DefaultTTFTChunk, p >= 0, p)
			got := trueTTFT(&m, work, DefaultTTFTChunk, p >= 0, p)
			worst = math.Max(worst, math.Abs(got-want)/want)
			mean += math.Abs(got-want) / want
			n++
		}
	}
	return worst, mean / float64(n)
}

// checkFit fails unless the fit is within 5 % of truth on average over the
// grid and 10 % everywhere: the quadratic term is informed only by the
// longest prompts, so at 200 samples of memory and 10–20 % noise its factor
// wanders by about ±0.2, some 4 % of a 30,000-token prediction (the prior,
// on the same grid, is off by 50 to 100 %).
func checkFit(t *testing.T, what string, f *rls, prior, truth *TimingModel) {
	t.Helper()
	if worst, mean := relErrors(f, prior, truth); worst > 0.10 || mean > 0.05 {
		t.Errorf("%s: the fit's relative error is %.3f at worst and %.3f on average, want ≤ 0.10 and ≤ 0.05 (factors %v)", what, worst, mean, f.theta)
	}
}

func TestCalibrationConverges(t *testing.T) {
	prior := defaultPrior()
	for _, tc := range []struct {
		name            string
		truth           TimingModel
		noise, outliers float64
	}{
		{"matched", prior, 0.1, 0},
		{"2x slower", scaled(prior, 2, 2, 2, 0), 0.1, 0.02},
		{"2x faster, queue", scaled(prior, 0.5, 0.5, 0.5, 30), 0.2, 0.05},
		{"other shape", scaled(prior, 3, 0.8, 1.5, 10), 0.1, 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newRLS()
			feed(f, &prior, &tc.truth, rand.New(rand.NewPCG(1, 2)), 3000, tc.noise, tc.outliers)
			checkFit(t, tc.name, f, &prior, &tc.truth)
		})
	}
}

func TestCalibrationForgets(t *testing.T) {
	prior := defaultPrior()
	f := newRLS()
	rng := rand.New(rand.NewPCG(3, 4))
	fast := scaled(prior, 1, 1, 1, 0)
	feed(f, &prior, &fast, rng, 2000, 0.1, 0.02)
	slow := scaled(prior, 2, 2, 2, 0)
	// 5 memories after the change the old speed weighs e^-5 < 1 %.
	feed(f, &prior, &slow, rng, 5*CalibrationMemory, 0.1, 0.02)
	checkFit(t, "after a change of speed", f, &prior, &slow)
}

// calibRouter is a router of workers w0..w(n-1) on a clock the test moves.
func calibRouter(t testing.TB, n int, calibrate bool) (*Router, *time.Time) {
	t.Helper()
	now := time.Unix(1000, 0)
	cfg := DefaultConfig()
	cfg.Calibrate = calibrate
	r, err := New(cfg, Options{Clock: func() time.Time { return now }, SweepInterval: -1, Rand: rand.New(rand.NewPCG(5, 6))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	for i := range n {
		r.AddWorker(fmt.Sprintf("w%d", i), 1)
	}
	return r, &now
}

// uniqueRequest is a prompt of blocks tokens' blocks no other request
// shares.
func uniqueRequest(i, blocks int) Request {
	h := make([]uint64, blocks)
	for b := range h {
		h[b] = uint64(i)<<20 | uint64(b) + 1
	}
	return Request{LocalHashes: h, BlockSize: 16}
}

func TestCalibrationPriorUntilMinSamples(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, now := calibRouter(t, 1, true)
	w := WorkerKey{ID: "w0"}
	prior := defaultPrior()
	truth := scaled(prior, 2, 2, 2, 0)
	for i := range 2 * CalibrationMinSamples {
		id := fmt.Sprint("r", i)
		req := uniqueRequest(i, 64)
		sel, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		c := r.CalibrationOf(w)
		if c.Fitted != (i >= CalibrationMinSamples) {
			t.Fatalf("before sample %d: fitted %v, want %v", i, c.Fitted, i >= CalibrationMinSamples)
		}
		if i < CalibrationMinSamples && c.Model != prior {
			t.Fatalf("before sample %d: model %+v, want the prior %+v", i, c.Model, prior)
		}
		// The engine computes the 1,024 uncached tokens at the true speed.
		*now = now.Add(time.Duration(trueTTFT(&truth, sel.ISL, DefaultTTFTChunk, false, 0) * float64(time.Millisecond)))
		if err := r.MarkPrefillComplete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := r.Free(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	c := r.CalibrationOf(w)
	if c.Samples != 2*CalibrationMinSamples {
		t.Errorf("samples %d, want %d", c.Samples, 2*CalibrationMinSamples)
	}
	got, want := trueTTFT(&c.Model, 1024, DefaultTTFTChunk, false, 0), trueTTFT(&truth, 1024, DefaultTTFTChunk, false, 0)
	if math.Abs(got-want)/want > 0.05 {
		t.Errorf("fitted prediction %.1f ms, want %.1f ± 5 %%", got, want)
	}
	if len(r.chain.timing.cal.pending) != 0 {
		t.Errorf("%d samples left pending after every request was freed", len(r.chain.timing.cal.pending))
	}
}

func TestCalibrationOffKeepsPrior(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, now := calibRouter(t, 1, false)
	for i := range 3 * CalibrationMinSamples {
		id := fmt.Sprint("r", i)
		if _, err := r.BestWorker(ctx, uniqueRequest(i, 64), BestWorkerOptions{RequestID: id}); err != nil {
			t.Fatal(err)
		}
		*now = now.Add(time.Second)
		_ = r.MarkPrefillComplete(ctx, id)
		_ = r.Free(ctx, id)
	}
	if c := r.CalibrationOf(WorkerKey{ID: "w0"}); c.Samples != 0 || c.Fitted || c.Model != defaultPrior() {
		t.Errorf("calibration off: %+v, want no samples and the prior", c)
	}
}

func TestPinTiming(t *testing.T) {
	r, _ := calibRouter(t, 2, true)
	slow := scaled(defaultPrior(), 2, 2, 2, 0)
	if err := r.PinTiming(WorkerKey{ID: "w1"}, slow); err != nil {
		t.Fatal(err)
	}
	if c := r.CalibrationOf(WorkerKey{ID: "w1"}); !c.Pinned || c.Model != slow {
		t.Errorf("pinned: %+v, want the pinned model", c)
	}
	if err := r.PinTiming(WorkerKey{ID: "w1"}, TimingModel{PrefillLinear: math.NaN()}); err == nil {
		t.Error("a NaN model was pinned")
	}
	if err := r.PinTiming(WorkerKey{ID: "w1"}, TimingModel{}); err == nil {
		t.Error("a zero prefill model was pinned")
	}
	r.UnpinTiming(WorkerKey{ID: "w1"})
	if c := r.CalibrationOf(WorkerKey{ID: "w1"}); c.Pinned || c.Model != defaultPrior() {
		t.Errorf("unpinned: %+v, want the prior", c)
	}
}

func TestTimingModelOf(t *testing.T) {
	prior := defaultPrior()
	m := TimingModelOf(prior.Prefill, prior.Decode, DefaultTTFTChunk)
	for _, tok := range []int{1, 100, 3000, 8192} {
		if a, b := m.Prefill(tok), prior.Prefill(tok); math.Abs(a-b) > 1e-9*b {
			t.Errorf("prefill(%d) = %v, want %v", tok, a, b)
		}
	}
	for _, p := range []float64{0, 0.3, 1} {
		if a, b := m.Decode(p), prior.Decode(p); math.Abs(a-b) > 1e-9*b {
			t.Errorf("decode(%v) = %v, want %v", p, a, b)
		}
	}
}

// A fitted or pinned model costs the scorer no allocation.
func TestCalibratedBestWorkerAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	ctx := context.Background()
	r, _ := calibRouter(t, 8, true)
	for i := range 8 {
		if err := r.PinTiming(WorkerKey{ID: fmt.Sprintf("w%d", i)}, scaled(defaultPrior(), 1+float64(i)/4, 1+float64(i)/4, 1, 5)); err != nil {
			t.Fatal(err)
		}
	}
	req := uniqueRequest(1, 64)
	if _, err := r.BestWorker(ctx, req, BestWorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() { _, _ = r.BestWorker(ctx, req, BestWorkerOptions{}) }); n != 0 {
		t.Errorf("BestWorker allocates %v times per call with calibrated workers", n)
	}
}

// BenchmarkTTFTScore is the ttft scorer alone over 64 candidates, at the
// configured curves (static) and with a model per rank (calibrated: the
// per-rank lookup and the model's polynomials), in one run.
func BenchmarkTTFTScore(b *testing.B) {
	const n = 64
	in := &ChainInput{ISL: 4096, BlockSize: 16, RequestBlocks: 256, Now: time.Unix(1000, 0), PoolRanks: n}
	cand := make([]int, n)
	for j := range n {
		in.Loads = append(in.Loads, PotentialLoad{Worker: WorkerKey{ID: fmt.Sprintf("w%02d", j)}, PotentialPrefillTokens: 4096 + 512*j,
			PotentialDecodeBlocks: 1000 * j, ActiveRequests: j})
		in.Overlap = append(in.Overlap, float64(j%8))
		in.Costs = append(in.Costs, 0)
		cand[j] = j
	}
	out := make([]float64, n)
	for _, mode := range []string{"static", "calibrated"} {
		b.Run(mode, func(b *testing.B) {
			cfg := DefaultConfig()
			sc, err := newTTFTScorer(&ChainArgs{Entry: ttftName, Config: cfg, args: map[string]string{}, used: map[string]bool{}})
			if err != nil {
				b.Fatal(err)
			}
			s := sc.(*ttftScorer)
			if mode == "calibrated" {
				for j := range n {
					m := scaled(s.prior, 1+float64(j)/n, 1+float64(j)/n, 1, 3)
					s.cal.pin(in.Loads[j].Worker, &m)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				s.Score(in, cand, out)
			}
		})
	}
}

// Samples, pins, reports and probes run concurrently (for the race
// detector: calibration's locks and atomics).
func TestCalibrationConcurrent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Unix(1000, 0)
	var clockMu sync.Mutex
	clock := func() time.Time {
		clockMu.Lock()
		defer clockMu.Unlock()
		now = now.Add(time.Millisecond)
		return now
	}
	r, err := New(DefaultConfig(), Options{Clock: clock, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 4 {
		r.AddWorker(fmt.Sprintf("w%d", i), 1)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				id := fmt.Sprintf("g%d-%d", g, i)
				if _, err := r.BestWorker(ctx, uniqueRequest(g*1000+i, 8), BestWorkerOptions{RequestID: id}); err != nil {
					t.Error(err)
					return
				}
				_, _ = r.BestWorker(ctx, uniqueRequest(i, 8), BestWorkerOptions{})
				_ = r.MarkPrefillComplete(ctx, id)
				_ = r.Free(ctx, id)
				if i%50 == 0 {
					_ = r.PinTiming(WorkerKey{ID: "w3"}, defaultPrior())
					_ = r.Calibration()
					r.UnpinTiming(WorkerKey{ID: "w3"})
				}
			}
		}()
	}
	wg.Wait()
	total := uint64(0)
	for _, c := range r.Calibration() {
		total += c.Samples
	}
	if total == 0 || total > 800 {
		t.Errorf("%d samples over the ranks, want 1..800", total)
	}
}
