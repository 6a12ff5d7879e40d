package localrouter

import (
	"math"

	"github.com/kvgate/kvgate/lib/timing"
)

// Online calibration (docs/localrouter.md "Calibration"): the ttft scorer
// prices each worker with its own TimingModel, fitted from what the router
// observes of that worker's requests: the time from placement to
// MarkPrefillComplete (the first token), against what the model predicted
// at placement from the worker's queued prefill, the request's uncached
// tokens and its decode load. Until a worker has CalibrationMinSamples
// samples, the configured curves (the chain's ttft arguments, or the
// defaults) are its model.

// TimingModel is an engine's iteration timing as the ttft scorer reads it,
// the shape of the mocker's (lib/timing): one iteration computing t new
// prompt tokens takes PrefillQuad·t² + PrefillLinear·t + PrefillFixed ms
// (0 for t = 0); one decode step at KV occupancy p (0..1) takes
// DecodeQuad·p² + DecodeLinear·p + DecodeFixed ms; QueueMs is a fixed delay
// each request sees before its first token besides the iterations (the
// engine's scheduling, the network, the first token's trip back).
type TimingModel struct {
	PrefillQuad, PrefillLinear, PrefillFixed float64
	DecodeQuad, DecodeLinear, DecodeFixed    float64
	QueueMs                                  float64
}

// Prefill is the prefill part of an iteration of t new tokens, in ms.
func (m *TimingModel) Prefill(t int) float64 {
	if t <= 0 {
		return 0
	}
	x := float64(t)
	return m.PrefillQuad*x*x + m.PrefillLinear*x + m.PrefillFixed
}

// Decode is one decode step at KV occupancy p (clamped to 0..1), in ms.
func (m *TimingModel) Decode(p float64) float64 {
	p = math.Min(math.Max(p, 0), 1)
	return m.DecodeQuad*p*p + m.DecodeLinear*p + m.DecodeFixed
}

// TimingModelOf interpolates a TimingModel through an engine's own curves:
// prefill(t), the ms of an iteration of t new tokens and no decode, at 1,
// chunk/2 and chunk tokens; decode(p), the ms of a decode-only iteration
// at KV occupancy p, at 0, ½ and 1. Exact for quadratic curves (the
// mocker's); the closest quadratic through those points otherwise. The
// replay's kvgate-oracle policy pins each simulated engine's model with it
// (Router.PinTiming).
func TimingModelOf(prefill func(tokens int) float64, decode func(kvUsage float64) float64, chunk int) TimingModel {
	chunk = max(chunk, 4)
	a, b, c := quadThrough(1, float64(chunk/2), float64(chunk), prefill(1), prefill(chunk/2), prefill(chunk))
	d2, d1, d0 := quadThrough(0, 0.5, 1, decode(0), decode(0.5), decode(1))
	return TimingModel{PrefillQuad: a, PrefillLinear: b, PrefillFixed: c, DecodeQuad: d2, DecodeLinear: d1, DecodeFixed: d0}
}

// quadThrough returns a, b, c of the quadratic a·x² + b·x + c through
// (x0, y0), (x1, y1), (x2, y2) (distinct x).
func quadThrough(x0, x1, x2, y0, y1, y2 float64) (a, b, c float64) {
	d01 := (y1 - y0) / (x1 - x0)
	d12 := (y2 - y1) / (x2 - x1)
	a = (d12 - d01) / (x2 - x0)
	b = d01 - a*(x0+x1)
	c = y0 - a*x0*x0 - b*x0
	return a, b, c
}

// defaultTimingModel is lib/timing's curves, prefill scaled by
// prefillScale, decode mapped linearly onto decodeEmpty..decodeFull (the
// ttft scorer's arguments).
func defaultTimingModel(prefillScale, decodeEmpty, decodeFull float64) TimingModel {
	k := (decodeFull - decodeEmpty) / (timing.DecodeMillis(1) - timing.DecodeMillis(0))
	return TimingModel{
		PrefillQuad: timing.PrefillQuad * prefillScale, PrefillLinear: timing.PrefillLinear * prefillScale, PrefillFixed: timing.PrefillFixed * prefillScale,
		DecodeQuad: timing.DecodeQuad * k, DecodeLinear: timing.DecodeLinear * k, DecodeFixed: decodeEmpty,
	}
}

// Calibration constants. The principle behind each:
//
//   - CalibrationMinSamples (20): the fit has calibParams = 4 parameters;
//     least squares' prediction variance at a typical point is about
//     σ²·p/n for n samples of noise σ², so at n = 5p = 20 a fitted
//     prediction carries a fifth of one sample's noise variance (its error
//     under half a sample's). Before that the configured curves predict.
//   - CalibrationMemory (200 samples, forgetting factor 1 − 1/200): the
//     fit weighs a sample k samples old by e^(−k/200), so it follows a
//     change of speed within a few hundred requests of that worker while
//     averaging the noise of two hundred (a prediction's error about
//     σ·√(p/200) = σ/7: 3 % at 20 % noise).
//   - Residuals are Huber-bounded at 2 × the running mean absolute
//     residual (over the last 20 samples; at least 5 % of the prediction):
//     Huber's k = 1.345σ, 95 % efficient under Gaussian noise, is 1.7 ×
//     the mean absolute residual (σ ≈ 1.25 × it), rounded up. An outlier
//     (a stall, a lost first token) moves the fit no more than a sample
//     two typical errors off, while a change of speed, which moves every
//     residual, widens the bound within a few dozen samples.
const (
	CalibrationMinSamples = 20
	CalibrationMemory     = 200
	calibParams           = 4
	// calibScaleMemory is the residual scale's memory: shorter than the
	// fit's, so that after a change of speed the bound widens within a
	// few dozen samples and the fit follows at full gain.
	calibScaleMemory = 20
	// calibQueueUnit scales the queue parameter's feature, so that every
	// parameter is of order one (its prior uncertainty 1 = 100 ms).
	calibQueueUnit = 100.0
	// calibMaxPending bounds the placed requests awaiting their first
	// token (a sample each); past it new ones are not sampled.
	calibMaxPending = 1 << 16
)

// Bounds of the fitted factors (× the prior's curves) and queue (ms): a
// fit outside them is clamped, so no run of odd samples prices a worker
// free or infinitely slow.
const (
	calibMinFactor = 0.02
	calibMaxFactor = 50
	calibMaxQueue  = 60_000
)

// WorkerCalibration is one worker rank's timing model as the ttft scorer
// uses it (Router.Calibration).
type WorkerCalibration struct {
	Worker WorkerKey
	// Model is the model in use: fitted, pinned, or the prior.
	Model TimingModel
	// Fitted: Model is the online fit (the pool's at least
	// CalibrationMinSamples samples); Pinned: it was set by PinTiming.
	// Neither: the prior.
	Fitted, Pinned bool
	// Samples is the number of first tokens observed on the rank,
	// PoolSamples on the whole pool (the shape's fit).
	Samples, PoolSamples uint64
	// Error is the running RMS relative error of the rank's predictions
	// (|observed − predicted| / observed, before each sample's update).
	Error float64
	// Factors are the pool's fitted parameters: the prefill quadratic and
	// linear factors and the decode factor over the prior's curves, and
	// the queue delay in ms.
	PrefillQuadFactor, PrefillLinearFactor, DecodeFactor, QueueMs float64
	// Speed is the rank's own factor over the pool's fit (its prefill and
	// decode times; 1 until the rank's samples tell it apart, see
	// calib_pool.go), SpeedRaw before shrinking.
	Speed, SpeedRaw float64
	// Histograms: the rank's engine latency histograms are scraped
	// (calib_hist.go); HistogramSamples of Samples came from them (first
	// tokens the lifecycle did not see). The Engine…Ms are the last
	// scrape interval's mean time to first token, inter-token latency,
	// queue, prefill and decode phase as the engine measured them (0:
	// none observed, or not reported).
	Histograms                                                                bool
	HistogramSamples                                                          uint64
	EngineTTFTMs, EngineITLMs, EngineQueueMs, EnginePrefillMs, EngineDecodeMs float64
}

// rls is one worker's exponentially weighted least squares fit, kept in
// information form (the weighted normal equations R·θ = b, solved after
// each sample: 4 unknowns), in units relative to the prior's prediction
// (each sample divided by it: the noise of a TTFT is about proportional to
// it). The prior enters as calibPriorWeight pseudo-observations of θ₀ that
// are renewed as the data is forgotten, so a direction the samples do not
// inform (e.g. the decode factor of a worker never decoding while it
// prefills) stays at the prior instead of drifting (no covariance windup).
type rls struct {
	theta  [calibParams]float64
	r      [calibParams][calibParams]float64
	b      [calibParams]float64
	n      uint64
	absRes float64 // running mean |relative residual|
	sqErr  float64 // running mean squared relative error
}

// rlsPrior is θ₀: the prior's curves (factors 1), no queue.
var rlsPrior = [calibParams]float64{1, 1, 1, 0}

// calibPriorWeight is the prior's weight in samples of relative error 1:
// at the samples' usual 10–30 % error, a fraction of one sample, so the
// data decides wherever it informs (and CalibrationMinSamples keeps the
// prior in use until it does).
const calibPriorWeight = 0.05

func newRLS() *rls {
	r := &rls{theta: rlsPrior, absRes: 0.1}
	for i := range calibParams {
		r.r[i][i] = calibPriorWeight
		r.b[i] = calibPriorWeight * rlsPrior[i]
	}
	return r
}

// predict is the fit's prediction of features x, in their units.
func (r *rls) predict(x *[calibParams]float64) float64 {
	var pred float64
	for i := range x {
		pred += r.theta[i] * x[i]
	}
	return pred
}

// update folds in one sample: features x (ms under the prior with unit
// factors) and the observed y (ms); scale is the prior's prediction.
func (r *rls) update(x [calibParams]float64, y, scale float64) { r.updateN(x, y, scale, 1) }

// updateN folds in the mean of m samples (m ≥ 1): x, y and scale their
// means. It weighs m samples (a mean of m has 1/m of one's variance) and
// forgets as m samples do; its residual is bounded at the Huber bound of
// a mean of m (the single-sample bound / √m).
func (r *rls) updateN(x [calibParams]float64, y, scale, m float64) {
	lambda := math.Pow(1-1.0/CalibrationMemory, m)
	for i := range x {
		x[i] /= scale
	}
	y /= scale
	var pred float64
	for i := range x {
		pred += r.theta[i] * x[i]
	}
	res := y - pred
	sq := math.Sqrt(m)
	if y > 0 {
		e := res / y
		r.sqErr += (e*e - r.sqErr) * m / math.Min(float64(r.n)+m, CalibrationMemory)
	}
	bound := math.Max(calibHuberK*r.absRes/sq, 0.05*math.Max(pred, 0.05))
	r.absRes += (math.Min(sq*math.Abs(res), 10*r.absRes+0.05) - r.absRes) * m / math.Min(float64(r.n)+m, calibScaleMemory)
	y = pred + math.Max(-bound, math.Min(bound, res)) // Huber: bounded influence
	for i := range calibParams {
		for j := range calibParams {
			r.r[i][j] = lambda*r.r[i][j] + m*x[i]*x[j]
		}
		r.r[i][i] += (1 - lambda) * calibPriorWeight
		r.b[i] = lambda*r.b[i] + m*x[i]*y + (1-lambda)*calibPriorWeight*rlsPrior[i]
	}
	if th, ok := solve4(r.r, r.b); ok {
		r.theta = th
	}
	for i := range 3 {
		r.theta[i] = math.Max(calibMinFactor, math.Min(calibMaxFactor, r.theta[i]))
	}
	r.theta[3] = math.Max(0, math.Min(calibMaxQueue/calibQueueUnit, r.theta[3]))
	r.n += uint64(m)
}

// solve4 solves a·x = b by Gaussian elimination with partial pivoting; ok
// is false for a singular a (never, with the prior's weight on the
// diagonal).
func solve4(a [calibParams][calibParams]float64, b [calibParams]float64) (x [calibParams]float64, ok bool) {
	for c := range calibParams {
		p := c
		for i := c + 1; i < calibParams; i++ {
			if math.Abs(a[i][c]) > math.Abs(a[p][c]) {
				p = i
			}
		}
		if !(math.Abs(a[p][c]) > 1e-300) {
			return x, false
		}
		a[c], a[p] = a[p], a[c]
		b[c], b[p] = b[p], b[c]
		for i := c + 1; i < calibParams; i++ {
			f := a[i][c] / a[c][c]
			for j := c; j < calibParams; j++ {
				a[i][j] -= f * a[c][j]
			}
			b[i] -= f * b[c]
		}
	}
	for i := calibParams - 1; i >= 0; i-- {
		v := b[i]
		for j := i + 1; j < calibParams; j++ {
			v -= a[i][j] * x[j]
		}
		x[i] = v / a[i][i]
	}
	for _, v := range x {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return x, false
		}
	}
	return x, true
}

// model is the fit applied to the prior.
func (r *rls) model(prior *TimingModel) TimingModel {
	q, l, d := r.theta[0], r.theta[1], r.theta[2]
	return TimingModel{
		PrefillQuad: prior.PrefillQuad * q, PrefillLinear: prior.PrefillLinear * l, PrefillFixed: prior.PrefillFixed * l,
		DecodeQuad: prior.DecodeQuad * d, DecodeLinear: prior.DecodeLinear * d, DecodeFixed: prior.DecodeFixed * d,
		QueueMs: prior.QueueMs + r.theta[3]*calibQueueUnit,
	}
}

// calibHuberK bounds residuals at calibHuberK × the running mean absolute
// residual (Huber's 1.345σ, σ ≈ 1.25 × it, rounded up; see the constants
// above). Measured at 5 and without a bound on the half-slow and
// other-curves profiles (docs/replay-results.md, "Calibration against the
// oracle, again"): no better on average, so kept.
const calibHuberK = 2.0
