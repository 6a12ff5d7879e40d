package localrouter

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// A pool's calibration has two levels, because the ranking compares
// ranks: an error common to all of them changes no choice, while noise in
// each rank's own fit does (measured: fitting every rank's four parameters
// apart cost 5 % of mean TTFT on engines that match the prior, the
// per-rank queue and factor estimates differing by noise alone; one
// shared fit cost 1 %).
//
//   - The shape (the four parameters of rls: prefill quadratic and linear
//     factors, decode factor, queue) is fitted on the samples of every
//     rank of the pool.
//   - Each rank has one speed factor over that shape, fitted by weighted
//     least squares with the same forgetting, then shrunk towards 1 by
//     its own significance: s = 1 + (ŝ − 1)·max(0, 1 − (2·SE/(ŝ − 1))²),
//     SE the factor's standard error (positive-part James–Stein
//     shrinkage at two standard errors): a rank is priced apart from the
//     pool only when its samples tell it apart, fully when they do so
//     clearly (a rank twice as slow: ŝ − 1 ≈ 0.3–1, SE a few
//     hundredths).

// workerFit is one rank's speed over the pool's fit, and its pin. The
// scorer reads speed (float64 bits) and pinned without a lock.
type workerFit struct {
	mu       sync.Mutex
	n        uint64
	sxx, sxy float64 // forgetting sums of pool prediction², prediction × observed
	absRes   float64
	sqErr    float64
	raw      float64
	speed    atomic.Uint64 // float64 bits: the shrunk factor in use
	pinned   atomic.Pointer[TimingModel]
}

func newWorkerFit() *workerFit {
	w := &workerFit{absRes: 0.1, raw: 1}
	w.speed.Store(math.Float64bits(1))
	return w
}

// calibSpeedPrior is the speed factor's prior weight, in samples of unit
// pool prediction: enough to keep a rank's first samples from swinging it.
const calibSpeedPrior = 1.0

// observeN folds in the mean of m samples of the rank (weighed as m, as
// rls.updateN): the pool's prediction and the observation, both relative
// to the sample's scale; a single sample is m = 1.
func (w *workerFit) observeN(pred, y, m float64) {
	lambda := math.Pow(1-1.0/CalibrationMemory, m)
	sq := math.Sqrt(m)
	s := math.Float64frombits(w.speed.Load())
	if y > 0 {
		e := (y - s*pred) / y
		w.sqErr += (e*e - w.sqErr) * m / math.Min(float64(w.n)+m, CalibrationMemory)
	}
	res := y - w.raw*pred
	bound := math.Max(calibHuberK*w.absRes/sq, 0.05*math.Max(w.raw*pred, 0.05))
	w.absRes += (math.Min(sq*math.Abs(res), 10*w.absRes+0.05) - w.absRes) * m / math.Min(float64(w.n)+m, calibScaleMemory)
	y = w.raw*pred + math.Max(-bound, math.Min(bound, res)) // Huber
	w.sxx = lambda*w.sxx + m*pred*pred
	w.sxy = lambda*w.sxy + m*pred*y
	w.raw = (w.sxy + calibSpeedPrior) / (w.sxx + calibSpeedPrior)
	w.raw = math.Max(calibMinFactor, math.Min(calibMaxFactor, w.raw))
	w.n += uint64(m)
	used := 1.0
	if w.n >= CalibrationMinSamples {
		se := 1.25 * w.absRes / math.Sqrt(w.sxx+calibSpeedPrior) // σ ≈ 1.25 × mean |residual|
		if d := w.raw - 1; d != 0 {
			used = 1 + d*math.Max(0, 1-4*se*se/(d*d))
		}
	}
	w.speed.Store(math.Float64bits(used))
}

// pendingSample is a placed request awaiting its first token.
type pendingSample struct {
	key   WorkerKey
	x     [calibParams]float64
	scale float64
	start time.Time
}

// calibration is the ttft scorer's timing models: the pool's shape (an
// rls) and each rank's speed. The scorer reads the shape through an
// atomic pointer (nil: the prior) and the ranks through an immutable map
// behind another (a new rank copies it under mu). Lock order: mu, then
// poolMu, then a workerFit's mu; samples take them one after the other,
// never together.
type calibration struct {
	learn   bool // Config.Calibrate: fit from samples (pins work either way)
	prior   *TimingModel
	mu      sync.Mutex
	pending map[string]pendingSample
	fits    atomic.Pointer[map[WorkerKey]*workerFit]
	poolMu  sync.Mutex
	pool    *rls
	shape   atomic.Pointer[TimingModel]
	dropped atomic.Uint64
	// hist is each rank's engine-histogram bookkeeping (calib_hist.go),
	// under mu.
	hist map[WorkerKey]*histState
	// noLifecycle: first tokens reported by the lifecycle are not samples
	// (Router.SetLifecycleSamples).
	noLifecycle atomic.Bool
}

func newCalibration(learn bool, prior *TimingModel) *calibration {
	c := &calibration{learn: learn, prior: prior, pending: map[string]pendingSample{}, pool: newRLS()}
	c.fits.Store(&map[WorkerKey]*workerFit{})
	return c
}

// model returns rank k's model in use and its speed factor (the model's
// prefill and decode times are to be multiplied by it); allocation-free.
func (c *calibration) model(k WorkerKey) (*TimingModel, float64) {
	fits := *c.fits.Load()
	if len(fits) == 0 { // nothing sampled nor pinned: no lookup
		return c.prior, 1
	}
	shape := c.shape.Load()
	if shape == nil {
		shape = c.prior
	}
	if w, ok := fits[k]; ok {
		if m := w.pinned.Load(); m != nil {
			return m, 1
		}
		return shape, math.Float64frombits(w.speed.Load())
	}
	return shape, 1
}

// fitFor returns rank k's fit, creating it. Callers hold c.mu.
func (c *calibration) fitFor(k WorkerKey) *workerFit {
	old := *c.fits.Load()
	if w, ok := old[k]; ok {
		return w
	}
	next := make(map[WorkerKey]*workerFit, len(old)+1)
	for key, w := range old {
		next[key] = w
	}
	w := newWorkerFit()
	next[k] = w
	c.fits.Store(&next)
	return w
}

// placed records request id's features on rank k, to be compared with its
// first token.
func (c *calibration) placed(id string, k WorkerKey, x [calibParams]float64, scale float64, now time.Time) {
	if !c.learn || id == "" || !(scale > 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) >= calibMaxPending {
		c.dropped.Add(1)
		return
	}
	c.pending[id] = pendingSample{key: k, x: x, scale: scale, start: now}
}

// firstToken takes request id's sample: its first token came at now.
func (c *calibration) firstToken(id string, now time.Time) {
	if !c.learn || c.noLifecycle.Load() {
		return
	}
	c.mu.Lock()
	s, ok := c.pending[id]
	if !ok {
		c.mu.Unlock()
		return
	}
	delete(c.pending, id)
	w := c.fitFor(s.key)
	y := float64(now.Sub(s.start)) / float64(time.Millisecond)
	if !(y > 0) || math.IsInf(y, 0) || w.pinned.Load() != nil {
		c.mu.Unlock()
		return
	}
	c.lifecycleSeen(s.key, y)
	c.mu.Unlock()
	c.apply(w, s.x, y, s.scale, 1)
}

// apply folds the mean of m samples of rank w into the pool's shape and
// the rank's speed: features x and scale, observed y ms. Callers hold no
// lock.
func (c *calibration) apply(w *workerFit, x [calibParams]float64, y, scale, m float64) {
	if w.pinned.Load() != nil {
		return
	}
	// The rank's speed is judged against the pool's shape as it stood
	// before this sample; the shape learns from the sample divided by the
	// rank's speed, so that a pool of mixed speeds fits one shape.
	c.poolMu.Lock()
	pred := c.pool.predict(&x) / scale
	speed := math.Float64frombits(w.speed.Load())
	c.pool.updateN(x, y/speed, scale, m)
	if c.pool.n >= CalibrationMinSamples {
		md := c.pool.model(c.prior)
		c.shape.Store(&md)
	}
	c.poolMu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.observeN(pred, y/scale, m)
}

// forget drops the pending samples of ids (freed before their first token,
// expired, or on a removed worker).
func (c *calibration) forget(ids ...string) {
	if !c.learn {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if s, ok := c.pending[id]; ok {
			delete(c.pending, id)
			c.keepUnsampled(s) // its first token may yet be in a histogram
		}
	}
}

// expire drops pending samples placed before cutoff.
func (c *calibration) expire(cutoff time.Time) {
	if !c.learn {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, s := range c.pending {
		if s.start.Before(cutoff) {
			delete(c.pending, id)
		}
	}
	for _, h := range c.hist {
		i := 0
		for i < len(h.unsampled) && h.unsampled[i].start.Before(cutoff) {
			i++
		}
		h.unsampled = h.unsampled[i:]
	}
}

// pin sets rank k's model; nil unpins it (back to the fit or the prior).
func (c *calibration) pin(k WorkerKey, m *TimingModel) {
	c.mu.Lock()
	w := c.fitFor(k)
	c.mu.Unlock()
	if m == nil {
		w.pinned.Store(nil)
		return
	}
	mm := *m
	w.pinned.Store(&mm)
}

// scaled is m with its prefill and decode times multiplied by speed.
func scaledModel(m *TimingModel, speed float64) TimingModel {
	return TimingModel{
		PrefillQuad: m.PrefillQuad * speed, PrefillLinear: m.PrefillLinear * speed, PrefillFixed: m.PrefillFixed * speed,
		DecodeQuad: m.DecodeQuad * speed, DecodeLinear: m.DecodeLinear * speed, DecodeFixed: m.DecodeFixed * speed,
		QueueMs: m.QueueMs,
	}
}

// report returns rank k's calibration.
func (c *calibration) report(k WorkerKey) WorkerCalibration {
	out := WorkerCalibration{Worker: k, Model: *c.prior, PrefillQuadFactor: 1, PrefillLinearFactor: 1, DecodeFactor: 1, Speed: 1, SpeedRaw: 1}
	c.poolMu.Lock()
	p := c.pool
	out.PoolSamples = p.n
	out.PrefillQuadFactor, out.PrefillLinearFactor, out.DecodeFactor, out.QueueMs = p.theta[0], p.theta[1], p.theta[2], p.theta[3]*calibQueueUnit
	c.poolMu.Unlock()
	m, speed := c.model(k)
	out.Model = scaledModel(m, speed)
	out.Fitted = m != c.prior
	c.histReport(k, &out)
	w, ok := (*c.fits.Load())[k]
	if !ok {
		return out
	}
	if pm := w.pinned.Load(); pm != nil {
		out.Pinned, out.Fitted = true, false
	}
	w.mu.Lock()
	out.Samples, out.Error, out.SpeedRaw = w.n, math.Sqrt(w.sqErr), w.raw
	out.Speed = math.Float64frombits(w.speed.Load())
	w.mu.Unlock()
	return out
}
