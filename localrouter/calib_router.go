package localrouter

import (
	"fmt"
	"math"
	"slices"
)

// calibPlaced records the features of request id placed on candidate j
// for the ttft scorer's calibration (calib.go).
func (r *Router) calibPlaced(in *ChainInput, j int, id string) {
	t := r.chain.timing
	if !t.cal.learn {
		return
	}
	x, scale := t.features(in, j)
	t.cal.placed(id, in.Loads[j].Worker, x, scale, in.Now)
}

// PinTiming sets worker rank k's timing model, the one the ttft scorer
// (and Selection.Cost) prices it with from now on, in place of the
// configured curves and of any online fit (whose samples are then
// ignored). The replay's kvgate-oracle policy pins each simulated
// engine's true model (TimingModelOf). The rank need not be a member yet.
// Safe for concurrent use.
func (r *Router) PinTiming(k WorkerKey, m TimingModel) error {
	for _, v := range []float64{m.PrefillQuad, m.PrefillLinear, m.PrefillFixed, m.DecodeQuad, m.DecodeLinear, m.DecodeFixed, m.QueueMs} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: timing model of %s: %g is not a finite number", ErrInvalidConfig, k, v)
		}
	}
	if !(m.Prefill(1) > 0) || !(m.Decode(0) >= 0) || !(m.Decode(1) >= 0) || m.QueueMs < 0 {
		return fmt.Errorf("%w: timing model of %s: prefill must be positive, decode and queue ≥ 0", ErrInvalidConfig, k)
	}
	r.chain.timing.cal.pin(k, &m)
	return nil
}

// UnpinTiming undoes PinTiming: rank k is priced by its fit again (or the
// configured curves).
func (r *Router) UnpinTiming(k WorkerKey) { r.chain.timing.cal.pin(k, nil) }

// Calibration reports the timing model of each member rank (sorted as
// Workers), then of the ranks it holds samples or a pin for that are not
// members (pinned before joining, or removed).
func (r *Router) Calibration() []WorkerCalibration {
	keys := slices.Clone(r.Workers())
	for k := range *r.chain.timing.cal.fits.Load() {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	out := make([]WorkerCalibration, 0, len(keys))
	for _, k := range keys {
		out = append(out, r.chain.timing.cal.report(k))
	}
	return out
}

// TTFTChunk is the ttft scorer's chunk (max_num_batched_tokens), the
// iteration the reports price (Calibration's prefill_chunk_ms).
func (r *Router) TTFTChunk() int { return r.chain.timing.chunk }

// SetLifecycleSamples sets whether the first tokens the lifecycle reports
// (MarkPrefillComplete) are calibration samples: on by default; off, only
// the engines' latency histograms are (calib_hist.go), as for a pool whose
// first tokens are never reported. The replay's kvgate-hist policy turns
// it off to measure calibration from the histograms alone. Safe for
// concurrent use.
func (r *Router) SetLifecycleSamples(on bool) { r.chain.timing.cal.noLifecycle.Store(!on) }

// CalibrationOf reports rank k's timing model.
func (r *Router) CalibrationOf(k WorkerKey) WorkerCalibration { return r.chain.timing.cal.report(k) }
