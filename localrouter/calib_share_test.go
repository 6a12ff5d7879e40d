package localrouter

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// shareEngine is a minimal engine for the share test, the seam the test
// replaces the mocker with (localrouter cannot import it): one FIFO queue of
// prompt tokens computed in iterations of at most chunk tokens, each taking
// model.Prefill(tokens) ms; a request's first token comes at the end of the
// iteration that computes its last prompt token.
type shareEngine struct {
	model TimingModel
	queue []shareReq
	busy  bool
	end   time.Time // of the running iteration
	done  []string  // requests whose last token the running iteration computes
}

type shareReq struct {
	id     string
	tokens int
}

// start begins an iteration at now if the engine is idle and has work.
func (e *shareEngine) start(now time.Time, chunk int) {
	if e.busy || len(e.queue) == 0 {
		return
	}
	budget, tokens := chunk, 0
	e.done = e.done[:0]
	for budget > 0 && len(e.queue) > 0 {
		q := &e.queue[0]
		take := min(q.tokens, budget)
		q.tokens -= take
		budget -= take
		tokens += take
		if q.tokens == 0 {
			e.done = append(e.done, q.id)
			e.queue = e.queue[1:]
		}
	}
	e.busy, e.end = true, now.Add(time.Duration(e.model.Prefill(tokens)*float64(time.Millisecond)))
}

// TestHeterogeneousShare: in a pool of two workers at the configured speed
// and two twice as slow, which the router is not told, the calibrated ttft
// scorer shares the prompt tokens between slow and fast workers as it does
// when told each worker's true model (PinTiming), within 0.1 of a fast
// worker's share, at half and at 90 % of the pool's capacity; the static
// scorer, pricing all four alike, gives the slow ones far more. The shares
// (slow over fast, after a warm-up of a tenth of the requests): at 50 %,
// static 0.59, calibrated 0.00, oracle 0.00 (the fast workers alone keep up
// and answer sooner); at 90 %, 0.51, 0.45 and 0.40 (0.44 and 0.37 before the
// externality was priced in the pool's token time, scorer_ttft.go): near saturation a slow
// worker gets about half a fast one's work, in proportion to its speed, as
// the pool needs all of it.
func TestHeterogeneousShare(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	prior := defaultPrior()
	speeds := []float64{1, 1, 0.5, 0.5}
	run := func(mode string, load float64) (ratio float64) {
		r, now := calibRouter(t, len(speeds), mode == "calibrated")
		engines := make([]*shareEngine, len(speeds))
		for i, s := range speeds {
			engines[i] = &shareEngine{model: scaled(prior, 1/s, 1/s, 1/s, 0)}
			if mode == "oracle" {
				if err := r.PinTiming(WorkerKey{ID: fmt.Sprintf("w%d", i)}, engines[i].model); err != nil {
					t.Fatal(err)
				}
			}
		}
		const (
			isl      = 2048
			requests = 3000
		)
		// Capacity at full chunks: 8,192 tokens per prefill(8,192) ms at
		// speed 1; the pool's is 3 such workers. Arrivals at 90 % of it.
		perMs := 3 * float64(DefaultTTFTChunk) / prior.Prefill(DefaultTTFTChunk)
		gap := time.Duration(float64(isl) / (load * perMs) * float64(time.Millisecond))
		tokens := make([]int, len(speeds))
		next := *now
		for i := 0; i < requests; {
			// The next event: an iteration's end, or the next arrival.
			first := -1
			for w, e := range engines {
				if e.busy && e.end.Before(next) && (first < 0 || e.end.Before(engines[first].end)) {
					first = w
				}
			}
			if first >= 0 {
				e := engines[first]
				*now, e.busy = e.end, false
				for _, id := range e.done {
					if err := r.MarkPrefillComplete(ctx, id); err != nil {
						t.Fatal(err)
					}
					if err := r.Free(ctx, id); err != nil {
						t.Fatal(err)
					}
				}
				e.start(*now, DefaultTTFTChunk)
				continue
			}
			*now = next
			id := fmt.Sprint("r", i)
			sel, err := r.BestWorker(ctx, uniqueRequest(i, isl/16), BestWorkerOptions{RequestID: id})
			if err != nil {
				t.Fatal(err)
			}
			var w int
			if _, err := fmt.Sscanf(sel.WorkerID, "w%d", &w); err != nil {
				t.Fatal(err)
			}
			engines[w].queue = append(engines[w].queue, shareReq{id: id, tokens: isl})
			engines[w].start(*now, DefaultTTFTChunk)
			if i >= requests/10 { // after a warm-up
				tokens[w] += isl
			}
			i++
			next = next.Add(gap)
		}
		fast, slow := float64(tokens[0]+tokens[1]), float64(tokens[2]+tokens[3])
		t.Logf("%s at %.0f %%: tokens per worker %v; slow/fast %.2f", mode, 100*load, tokens, slow/fast)
		for _, c := range r.Calibration() {
			t.Logf("  %s: samples %d error %.2f factors %.2f %.2f %.2f queue %.1f ms", c.Worker, c.Samples, c.Error, c.PrefillQuadFactor, c.PrefillLinearFactor, c.DecodeFactor, c.QueueMs)
		}
		return slow / fast
	}
	for _, load := range []float64{0.5, 0.9} {
		static, calibrated, oracle := run("static", load), run("calibrated", load), run("oracle", load)
		if math.Abs(calibrated-oracle) > 0.1 {
			t.Errorf("at %.0f %% load a slow worker gets %.2f of a fast one's tokens when calibrated, %.2f when told the truth: want within 0.1", 100*load, calibrated, oracle)
		}
		if static-oracle < 0.1 {
			t.Errorf("at %.0f %% load a slow worker gets %.2f of a fast one's tokens under the static scorer, %.2f when told the truth: the test does not tell them apart", 100*load, static, oracle)
		}
	}
}
