package localrouter

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/mocker"
)

// The ttft scorer's formula, ported from sim/ttft_test.go (the replay's
// copy it replaces): mocker.DefaultTiming at its defaults.
func newTestTTFT(t *testing.T, args map[string]string) *ttftScorer {
	t.Helper()
	cfg := DefaultConfig()
	a := &ChainArgs{Entry: "ttft", Config: cfg, args: args, used: map[string]bool{}}
	s, err := newTTFTScorer(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.unknown(); err != nil {
		t.Fatal(err)
	}
	return s.(*ttftScorer)
}

func ttftIn(l PotentialLoad, isl int) *ChainInput {
	return &ChainInput{Loads: []PotentialLoad{l}, Overlap: []float64{float64(l.OverlapBlocks)}, ISL: isl, BlockSize: 16, PoolRanks: 1}
}

func TestTTFTScoreFollowsTheTimingModel(t *testing.T) {
	m := newTestTTFT(t, map[string]string{"ext": "1"})
	tok := mocker.PrefillMillis(8192) / 8192
	near := func(t *testing.T, what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s: score %.6f ms, want %.6f", what, got, want)
		}
	}
	near(t, "idle, cold", m.millis(ttftIn(PotentialLoad{PotentialPrefillTokens: 8192}, 8192), 0, 0),
		mocker.PrefillMillis(8192)+8192*tok)
	near(t, "idle, warm", m.millis(ttftIn(PotentialLoad{PotentialPrefillTokens: 16, OverlapBlocks: 511}, 8192), 0, 0),
		mocker.PrefillMillis(16)+16*tok)
	busy := PotentialLoad{PotentialPrefillTokens: 18192, PotentialDecodeBlocks: 32768, ActiveRequests: 3}
	near(t, "busy", m.millis(ttftIn(busy, 8192), 0, 0),
		2*mocker.PrefillMillis(8192)+mocker.PrefillMillis(18192-2*8192)+3*mocker.DecodeMillis(0.5)+8192*tok)
	m0 := newTestTTFT(t, map[string]string{"ext": "0"})
	near(t, "ext 0", m0.millis(ttftIn(busy, 8192), 0, 0), m.millis(ttftIn(busy, 8192), 0, 0)-8192*tok)
	// Calibration halved (a GPU twice as fast): every term halves.
	m2 := newTestTTFT(t, map[string]string{"ext": "1", "prefill_ms": fmtF(mocker.PrefillMillis(8192) / 2),
		"decode_empty_ms": fmtF(mocker.DecodeMillis(0) / 2), "decode_full_ms": fmtF(mocker.DecodeMillis(1) / 2)})
	near(t, "twice as fast", m2.millis(ttftIn(busy, 8192), 0, 0), m.millis(ttftIn(busy, 8192), 0, 0)/2)
	// The engine's KV usage, when higher, sets the occupancy.
	eng := busy
	eng.HasEngine, eng.Engine.HasKVUsage, eng.Engine.KVUsage = true, true, 0.9
	near(t, "engine kv usage", m.millis(ttftIn(eng, 8192), 0, 0),
		2*mocker.PrefillMillis(8192)+mocker.PrefillMillis(18192-2*8192)+3*mocker.DecodeMillis(0.9)+8192*tok)
	// A lower tier's blocks count at their weight: 100 blocks on the CPU
	// at 0.8 leave 20 blocks' worth of tokens to compute.
	in := ttftIn(PotentialLoad{PotentialPrefillTokens: 8192}, 8192)
	in.Overlap[0] = 80
	near(t, "cpu tier", m.millis(in, 0, 0), mocker.PrefillMillis(8192-1280)+(8192-1280)*tok)
}

func fmtF(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func TestTTFTScoreOrdersWorkers(t *testing.T) {
	m := newTestTTFT(t, map[string]string{"ext": "1"})
	const bs, isl = 16, 4096
	sc := func(m *ttftScorer, l PotentialLoad) float64 { return m.millis(ttftIn(l, isl), 0, 0) }
	idle := PotentialLoad{PotentialPrefillTokens: isl}
	cached := PotentialLoad{PotentialPrefillTokens: 16, OverlapBlocks: isl/bs - 1}
	for _, c := range []struct {
		name          string
		better, worse PotentialLoad
	}{
		{"a cached prefix beats none", cached, idle},
		{"a shorter queue wins", idle, PotentialLoad{PotentialPrefillTokens: isl + 1000, ActiveRequests: 1}},
		{"lower KV occupancy wins", PotentialLoad{PotentialPrefillTokens: isl, PotentialDecodeBlocks: 1000, ActiveRequests: 1},
			PotentialLoad{PotentialPrefillTokens: isl, PotentialDecodeBlocks: 60000, ActiveRequests: 1}},
		{"a cached worker's queue counts", PotentialLoad{PotentialPrefillTokens: 16 + 100, OverlapBlocks: isl/bs - 1, ActiveRequests: 1},
			PotentialLoad{PotentialPrefillTokens: 16 + 2000, OverlapBlocks: isl/bs - 1, ActiveRequests: 1}},
	} {
		if b, w := sc(m, c.better), sc(m, c.worse); !(b < w) {
			t.Errorf("%s: scores %.3f and %.3f ms, want the first lower", c.name, b, w)
		}
	}
	queued := PotentialLoad{PotentialPrefillTokens: 16 + 5000, OverlapBlocks: isl/bs - 1, ActiveRequests: 1}
	m0 := newTestTTFT(t, map[string]string{"ext": "0"})
	if sc(m0, queued) <= sc(m0, idle) {
		t.Errorf("ext 0: the queued cached worker scores %.1f ms, the idle one %.1f: want the idle one lower", sc(m0, queued), sc(m0, idle))
	}
	if sc(m, queued) >= sc(m, idle) {
		t.Errorf("ext 1: the queued cached worker scores %.1f ms, the idle one %.1f: want the cached one lower", sc(m, queued), sc(m, idle))
	}
}

// With ext=auto the externality is the requests expected to arrive at the
// worker before this one's first token: rate per worker × predicted TTFT.
func TestTTFTScoreMeasuredExternality(t *testing.T) {
	const isl = 4096
	l := PotentialLoad{PotentialPrefillTokens: isl + 6000, ActiveRequests: 2, PotentialDecodeBlocks: 1000}
	m := newTestTTFT(t, map[string]string{"ext": "auto"})
	ttft := m.millis(ttftIn(l, isl), 0, 0)
	want := ttft + 0.004*ttft*isl*m.tokenMillis()
	if got := m.millis(ttftIn(l, isl), 0, 0.004); math.Abs(got-want) > 1e-9*want {
		t.Errorf("score %.6f ms, want %.6f", got, want)
	}
	// Score reads the rate of the pool's placements per rank, this
	// request counted: one placement a second ago, 4 ranks.
	now := time.Unix(1000, 0)
	m.Chosen(&ChainInput{Now: now.Add(-time.Second)}, 0)
	in := ttftIn(l, isl)
	in.Now, in.PoolRanks = now, 4
	rate := (0.1*math.Exp(-0.1) + 0.1) / 4 / 1000
	out := make([]float64, 1)
	m.Score(in, []int{0}, out)
	if w := m.millis(in, 0, rate) / (m.tokenMillis() * 16); math.Abs(out[0]-w) > 1e-9*w {
		t.Errorf("Score %.6f blocks, want %.6f", out[0], w)
	}
}

func TestTTFTArrivalRate(t *testing.T) {
	var a rateEstimator
	now := time.Unix(1000, 0)
	for range 2000 { // 20/s for 100 s: ten time constants
		now = now.Add(50 * time.Millisecond)
		a.observe(now)
	}
	if got := a.at(now); got < 19 || got > 21 {
		t.Errorf("rate after 100 s of 20 arrivals/s: %.2f/s, want about 20", got)
	}
	if got := a.at(now.Add(30 * time.Second)); got > 2 {
		t.Errorf("rate after 30 s of silence: %.2f/s, want below 2", got)
	}
}

func TestTTFTArgs(t *testing.T) {
	for _, bad := range []string{"ttft/ext=-1", "ttft/ext=x", "ttft/chunk=0", "ttft/prefill_ms=0", "ttft/decode_full_ms=1/decode_empty_ms=2", "ttft/kv_tokens=8", "ttft/speed=2"} {
		specs, err := ParseWorkerChain(bad)
		if err == nil {
			err = ValidateWorkerChain(specs, DefaultConfig())
		}
		if err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestSelectionCostIsOneUnit: Selection.Cost is the ttft prediction in
// milliseconds whatever the chain (the global router compares it across
// pools), the chain's own total is ChainScore: under the default chain
// ChainScore is the same prediction in blocks of prefill time; under
// Dynamo's it is Dynamo's cost, and Cost is still the milliseconds.
func TestSelectionCostIsOneUnit(t *testing.T) {
	prompt := toks(64, 1)
	costs := map[string]float64{}
	for _, chain := range []string{"saturation,ttft", "cost", "prefix=2,decode", "ttft/prefill_ms=5000"} {
		r := chainRouter(t, chain, nil)
		storeTokens(t, r, "b", prompt[:32])
		if _, err := r.Commit(testenv.Context(t), "x", WorkerKey{ID: "a", DPRank: 0}, Request{Tokens: toks(64, 900)}); err != nil {
			t.Fatal(err)
		}
		sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: prompt}, BestWorkerOptions{Worker: &WorkerKey{ID: "b", DPRank: 0}})
		if err != nil {
			t.Fatal(err)
		}
		costs[chain] = sel.Cost
		blockMs := DefaultTTFTPrefillMillis / DefaultTTFTChunk * 4
		switch chain {
		case "saturation,ttft":
			if got := sel.ChainScore * blockMs; math.Abs(got-sel.Cost) > 1e-9*sel.Cost {
				t.Errorf("%s: ChainScore %g blocks = %g ms, Cost %g ms; want equal", chain, sel.ChainScore, got, sel.Cost)
			}
		case "cost":
			// b: prefill (64-32)/4 = 8 blocks, decode 16 blocks.
			if sel.ChainScore != 8+16 {
				t.Errorf("%s: ChainScore %g, want Dynamo's cost 24", chain, sel.ChainScore)
			}
		case "ttft/prefill_ms=5000":
			if sel.Cost <= costs["saturation,ttft"] {
				t.Errorf("%s: Cost %g ms, want above the default calibration's %g", chain, sel.Cost, costs["saturation,ttft"])
			}
		}
		if !(sel.Cost > 0) {
			t.Errorf("%s: Cost %g, want > 0 ms", chain, sel.Cost)
		}
		// TTFT is Cost without the externality term (ext 1: the
		// request's 32 uncached tokens at the calibration's ms a token).
		tokenMs := DefaultTTFTPrefillMillis / DefaultTTFTChunk
		if chain == "ttft/prefill_ms=5000" {
			tokenMs = 5000.0 / DefaultTTFTChunk
		}
		if want := sel.Cost - 32*tokenMs; !(sel.TTFT > 0) || math.Abs(sel.TTFT-want) > 1e-9*sel.Cost {
			t.Errorf("%s: TTFT %g ms, want Cost %g less 32 uncached tokens' prefill = %g", chain, sel.TTFT, sel.Cost, want)
		}
	}
	for _, chain := range []string{"cost", "prefix=2,decode"} {
		if costs[chain] != costs["saturation,ttft"] {
			t.Errorf("Cost under %s %g ms, under the default chain %g ms; want one unit", chain, costs[chain], costs["saturation,ttft"])
		}
	}
}

// TestTTFTExternalityInPoolTime: the externality is priced at the pool's
// token time (the harmonic mean of the considered ranks' own: a worker at
// the pool's mean speed), not the candidate's. On a pool of one worker at
// the configured speed and one twice as slow, the externality of a
// candidate's uncached tokens is the same on both, at 4/3 of the fast
// one's token time, and the difference between their scores is the
// difference between their predicted TTFTs; on a pool of equal workers
// (both twice as slow) it is each one's own token time, as before the
// rule.
func TestTTFTExternalityInPoolTime(t *testing.T) {
	const isl = 4096
	fast, slow := WorkerKey{ID: "fast"}, WorkerKey{ID: "slow"}
	in := &ChainInput{
		Loads: []PotentialLoad{
			{Worker: fast, PotentialPrefillTokens: isl + 3000, ActiveRequests: 2, PotentialDecodeBlocks: 1000},
			{Worker: slow, PotentialPrefillTokens: isl + 1000, ActiveRequests: 1, PotentialDecodeBlocks: 500},
		},
		Overlap: []float64{0, 0}, ISL: isl, BlockSize: 16, PoolRanks: 2,
	}
	for _, tc := range []struct {
		name       string
		fastFactor float64 // fast's times × this (slow's are × 2)
		poolToken  float64 // want, in units of the configured token time
	}{
		{"one slow worker", 1, 4.0 / 3},
		{"equal workers", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m1 := newTestTTFT(t, map[string]string{"ext": "1"})
			m0 := newTestTTFT(t, map[string]string{"ext": "0"})
			for _, m := range []*ttftScorer{m1, m0} {
				s2 := scaledModel(&m.prior, 2)
				m.cal.pin(slow, &s2)
				if tc.fastFactor != 1 {
					f := scaledModel(&m.prior, tc.fastFactor)
					m.cal.pin(fast, &f)
				}
			}
			want := isl * tc.poolToken * m1.tokenMillis()
			for j, k := range []WorkerKey{fast, slow} {
				ext := m1.millis(in, j, 0) - m0.millis(in, j, 0)
				if math.Abs(ext-want) > 1e-9*want {
					t.Errorf("%s: externality %.6f ms, want %.6f (%g × the configured token time × %d tokens)", k.ID, ext, want, tc.poolToken, isl)
				}
			}
			// Score computes the pool's token time once: the same scores.
			out := make([]float64, 2)
			m1.Score(in, []int{0, 1}, out)
			block := m1.tokenMillis() * 16
			for j := range out {
				if w := m1.millis(in, j, 0) / block; math.Abs(out[j]-w) > 1e-9*w {
					t.Errorf("Score[%d] %.6f blocks, want %.6f", j, out[j], w)
				}
			}
		})
	}
}
