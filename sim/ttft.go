package sim

import (
	"fmt"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

// ttftChain is the local routers' worker chain under a KindTTFT policy:
// the saturation filter, then the local router's ttft scorer
// (localrouter/scorer_ttft.go) told what an operator configures on the
// engines, their chunk (max_num_batched_tokens) and KV capacity, and the
// shipped timing curves (the mocker's at speed 1) whatever the engines'
// speed: what they run is for the policy's Calibration to find out
// (online, or pinned by the oracle), so that what the replay measures is
// the scorer a deployment runs. Several pools are ranked by the global
// router's cost policy on Selection.Cost, the ttft scorer's prediction in
// milliseconds.
func (p Policy) ttftChain(cfg Config) []localrouter.ScorerSpec {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	ext := "auto"
	if !p.ExtAuto {
		ext = f(p.Externality)
	}
	return []localrouter.ScorerSpec{
		{Name: "saturation"},
		{Name: "ttft", Weight: 1, Args: map[string]string{
			"ext":             ext,
			"chunk":           strconv.Itoa(cfg.MaxNumBatchedTokens),
			"prefill_ms":      f(mocker.PrefillMillis(cfg.MaxNumBatchedTokens)),
			"decode_empty_ms": f(mocker.DecodeMillis(0)),
			"decode_full_ms":  f(mocker.DecodeMillis(1)),
			"kv_tokens":       strconv.Itoa(cfg.KVTokens),
		}},
	}
}

// engineTimings are the simulated engines' true timing models, one per
// worker (run.workers' index): every engine runs mocker.DefaultTiming at
// the replay's speedup. Engine profiles that differ per worker return
// their own slice here; kvgate-oracle pins exactly these.
func engineTimings(cfg Config) []mocker.Timing {
	out := make([]mocker.Timing, cfg.Workers)
	for i := range out {
		out[i] = mocker.DefaultTiming{Speedup: cfg.Speedup}
	}
	return out
}

// pinOracle pins, under a kvgate-oracle policy (CalibrationOracle), each
// worker of pool's true timing model on the pool's router: timings[i] is
// worker i's engine timing (engineTimings), read as a
// localrouter.TimingModel through its IterationTime at chunk. Other
// policies pin nothing.
func (p Policy) pinOracle(pool *simPool, timings []mocker.Timing, chunk int) error {
	if p.Kind != KindTTFT || p.Calibration != CalibrationOracle {
		return nil
	}
	for _, w := range pool.workers {
		if w.index >= len(timings) {
			return fmt.Errorf("%w: no engine timing for worker %s (%d timings)", ErrConfig, w.key, len(timings))
		}
		if err := p.pinWorker(pool, w, timings[w.index], chunk); err != nil {
			return err
		}
	}
	return nil
}

// pinWorker pins worker w's true timing model under a kvgate-oracle
// policy (pinOracle's, for one worker added alone).
func (p Policy) pinWorker(pool *simPool, w *worker, timing mocker.Timing, chunk int) error {
	if p.Kind != KindTTFT || p.Calibration != CalibrationOracle {
		return nil
	}
	return pool.router.PinTiming(w.key, oracleModel(timing, chunk))
}

// oracleModel is timing read as the ttft scorer's model: prefill-only and
// decode-only iterations priced by the engine's own IterationTime.
func oracleModel(timing mocker.Timing, chunk int) localrouter.TimingModel {
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return localrouter.TimingModelOf(
		func(t int) float64 { return msOf(timing.IterationTime(mocker.Batch{PrefillTokens: t})) },
		func(p float64) float64 { return msOf(timing.IterationTime(mocker.Batch{DecodeSeqs: 1, KVUsage: p})) },
		chunk)
}
