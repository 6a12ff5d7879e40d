package localrouter

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/lib/timing"
)

// ttftScorer is kvgate's principled scorer (docs/localrouter.md "The ttft
// scorer"; derivation in docs/replay-results.md "Round 2, principled
// default"): the waiting a request adds to the pool on a candidate, its
// predicted time to first token there plus the delay its own uncached
// prefill imposes on the requests expected to arrive behind it:
//
//	work  = the others' active prefill tokens + the request's uncached ones
//	n     = ceil(work / chunk)                       (prefill iterations)
//	ttft  = (n-1)·prefill(chunk) + prefill(work - (n-1)·chunk)
//	      + n·decode(kv occupancy)   when the worker has requests running
//	ext   = 1 by default (or a number); ext=auto: arrival rate per worker × ttft
//	score = ttft + ext × uncached tokens × the pool's prefill time per token
//
// in milliseconds, written out in blocks of prefill time (score divided
// by block_size × prefill(chunk) / chunk), so that its weight compares
// with the other scorers'. Selection.Cost is the milliseconds themselves,
// for the chosen worker (by this scorer's calibration when it is in the
// chain, the default one otherwise), the unit the global router's cost
// policy compares pools in.
//
// prefill and decode are the mocker's timing model (mocker.DefaultTiming)
// scaled to three numbers an operator measures on their GPU: prefill_ms,
// one prefill iteration of a full chunk (max_num_batched_tokens, arg
// chunk); decode_empty_ms and decode_full_ms, one decode step at an empty
// and at a full KV cache; and the KV capacity kv_tokens. Occupancy is the
// candidate's active decode blocks over the capacity, or the engine's
// reported KV usage where it is scraped and higher.
//
// The arrival rate is the pool's placements (requests recorded with a
// request id, or UpdateIndexer) counted with an exponential decay of time
// constant 10 s on the router's Clock, divided by the pool's ranks; probes
// read it without a lock. Cached blocks on lower tiers count at their
// TierWeights (a CPU block at 0.8 saves 0.8 of its prefill).
type ttftScorer struct {
	chunk                                int
	prefillMs, decodeEmptyMs, decodeFull float64
	kvBlocks                             float64
	blockSize                            int
	ext                                  float64 // when !auto
	auto                                 bool
	// rate: the pool's placements (per rank: divided by PoolRanks).
	rate                                  rateEstimator
	prefillScale, decodeShape, decodeBase float64
	// prior is the model of the arguments above; cal holds each rank's
	// own (calib.go: fitted online when Config.Calibrate, or pinned).
	prior TimingModel
	cal   *calibration
}

// TTFT calibration defaults: mocker.DefaultTiming at a full chunk of 8,192
// tokens and a 1 M-token KV cache.
const (
	DefaultTTFTChunk    = 8192
	DefaultTTFTKVTokens = 1 << 20
)

// DefaultTTFTPrefillMillis, DefaultTTFTDecodeEmptyMillis and
// DefaultTTFTDecodeFullMillis are the mocker's timing at those defaults.
var (
	DefaultTTFTPrefillMillis     = timing.PrefillMillis(DefaultTTFTChunk)
	DefaultTTFTDecodeEmptyMillis = timing.DecodeMillis(0)
	DefaultTTFTDecodeFullMillis  = timing.DecodeMillis(1)
)

// TTFTRateWindow is the arrival-rate estimator's time constant.
const TTFTRateWindow = 10 * time.Second

func newTTFTScorer(a *ChainArgs) (Scorer, error) {
	s := &ttftScorer{blockSize: a.Config.BlockSize}
	num := func(key string, def float64, ok func(float64) bool, want string) (float64, error) {
		v, err := a.Float(key, def)
		if err != nil {
			return 0, err
		}
		if !ok(v) {
			return 0, fmt.Errorf("%w: worker chain %q: %s %g must be %s", ErrInvalidConfig, a.Entry, key, v, want)
		}
		return v, nil
	}
	pos := func(v float64) bool { return v > 0 }
	count := func(v float64) bool { return v >= 1 && v == math.Trunc(v) && v <= 1<<40 }
	chunk, err := num("chunk", DefaultTTFTChunk, count, "a token count ≥ 1")
	if err != nil {
		return nil, err
	}
	s.chunk = int(chunk)
	if s.prefillMs, err = num("prefill_ms", DefaultTTFTPrefillMillis, pos, "> 0"); err != nil {
		return nil, err
	}
	if s.decodeEmptyMs, err = num("decode_empty_ms", DefaultTTFTDecodeEmptyMillis, func(v float64) bool { return v >= 0 }, "≥ 0"); err != nil {
		return nil, err
	}
	if s.decodeFull, err = num("decode_full_ms", DefaultTTFTDecodeFullMillis, func(v float64) bool { return v >= s.decodeEmptyMs }, "≥ decode_empty_ms"); err != nil {
		return nil, err
	}
	kv, err := num("kv_tokens", DefaultTTFTKVTokens, func(v float64) bool { return v >= float64(s.blockSize) && v == math.Trunc(v) }, "a token count of at least one block")
	if err != nil {
		return nil, err
	}
	s.kvBlocks = math.Floor(kv / float64(s.blockSize))
	ext, err := a.String("ext", "1")
	if err != nil {
		return nil, err
	}
	if ext == "auto" {
		s.auto = true
	} else {
		f, perr := strconv.ParseFloat(ext, 64)
		if perr != nil || !(f >= 0) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: worker chain %q: ext %q must be auto or a number ≥ 0", ErrInvalidConfig, a.Entry, ext)
		}
		s.ext = f
	}
	// The mocker's curves scaled to the measured points: prefill(t) =
	// timing.PrefillMillis(t) × prefill_ms / timing.PrefillMillis(chunk);
	// decode(p) = decode_empty + (decode_full − decode_empty) × the
	// mocker's decode curve normalised to 0..1.
	s.prefillScale = s.prefillMs / timing.PrefillMillis(s.chunk)
	s.decodeBase = timing.DecodeMillis(0)
	s.decodeShape = timing.DecodeMillis(1) - s.decodeBase
	s.prior = defaultTimingModel(s.prefillScale, s.decodeEmptyMs, s.decodeFull)
	s.cal = newCalibration(a.Config.Calibrate, &s.prior)
	return s, nil
}

func (s *ttftScorer) prefill(tokens int) float64 {
	return timing.PrefillMillis(tokens) * s.prefillScale
}

func (s *ttftScorer) decode(p float64) float64 {
	return s.decodeEmptyMs + (s.decodeFull-s.decodeEmptyMs)*(timing.DecodeMillis(p)-s.decodeBase)/s.decodeShape
}

// tokenMillis is the prefill time of one token in a full chunk.
func (s *ttftScorer) tokenMillis() float64 { return s.prefillMs / float64(s.chunk) }

// ttftShape is what a candidate's prediction is made of: the prefill
// work ahead of its first token (queued and its own uncached tokens) in n
// iterations of chunk tokens, the last of rest; p the KV occupancy of the
// decode step each iteration also pays when decoding.
type ttftShape struct {
	work, n, rest, uncached int
	decoding                bool
	p                       float64
}

func (s *ttftScorer) shape(in *ChainInput, j int) ttftShape {
	l := &in.Loads[j]
	cachedTokens := int(math.Round(in.Overlap[j] * float64(in.BlockSize)))
	own := max(in.ISL-cachedTokens, 0)
	work := max(activePrefill(*l, in.ISL, in.BlockSize)+own, 1) // at least one token is computed
	n := (work + s.chunk - 1) / s.chunk
	sh := ttftShape{work: work, n: n, rest: work - (n-1)*s.chunk, uncached: max(in.ISL-cachedTokens, 1)}
	if l.ActiveRequests > 0 {
		sh.decoding = true
		sh.p = math.Min(float64(l.PotentialDecodeBlocks)/s.kvBlocks, 1)
		if l.HasEngine && l.Engine.HasKVUsage {
			sh.p = math.Max(sh.p, math.Min(l.Engine.KVUsage, 1))
		}
	}
	return sh
}

// millis is the predicted score in ms of candidate j under its rank's
// model; perWorker is the arrival rate per worker in requests/ms
// (ext=auto).
func (s *ttftScorer) millis(in *ChainInput, j int, perWorker float64) float64 {
	return s.millisAt(in, j, perWorker, s.poolTokenMillis(in))
}

// tokenMillisOf is the prefill time of one token in a full chunk on rank
// k under its model (the configured curves, calibrated or pinned).
func (s *ttftScorer) tokenMillisOf(k WorkerKey) float64 {
	m, speed := s.cal.model(k)
	if m == &s.prior && speed == 1 {
		return s.tokenMillis()
	}
	return speed * m.Prefill(s.chunk) / float64(s.chunk)
}

// poolTokenMillis is the pool's prefill time of one token: the harmonic
// mean of the considered ranks' own (in.Loads), the token time of a
// worker at the pool's mean speed. The externality is priced in it, not
// in the candidate's own token time: the requests delayed behind a
// placement on worker w arrive there at about λ_w = λ·s_w/Σs (a pool
// sharing work by speed s), each delayed by the placement's uncached
// tokens at w's token time τ₀/s_w; their product, λ/Σs · uncached · τ₀,
// is the same on every worker. Pricing it at the candidate's own token
// time counted a slow worker's slowness twice (its TTFT already has it),
// and the scorer told the true speeds overloaded the fast workers
// (docs/replay-results.md, "Heterogeneous pools"). On a pool of equal
// workers it is each worker's own, and nothing changes.
func (s *ttftScorer) poolTokenMillis(in *ChainInput) float64 {
	if len(in.Loads) == 0 {
		return s.tokenMillis()
	}
	var inv float64
	for i := range in.Loads {
		inv += 1 / s.tokenMillisOf(in.Loads[i].Worker)
	}
	return float64(len(in.Loads)) / inv
}

// millisAt is millis with the pool's token time given (Score computes it
// once per decision).
func (s *ttftScorer) millisAt(in *ChainInput, j int, perWorker, poolTokenMs float64) float64 {
	ms, ext := s.parts(in, j, perWorker, poolTokenMs)
	return ms + ext
}

// ttftMillis is candidate j's predicted time to first token alone (millis
// without the externality term): Selection.TTFT.
func (s *ttftScorer) ttftMillis(in *ChainInput, j int) float64 {
	ms, _ := s.parts(in, j, 0, 0)
	return ms
}

// parts are millisAt's two terms: the predicted time to first token, and
// the delay the request's uncached prefill imposes on those behind it,
// priced at poolTokenMs a token.
func (s *ttftScorer) parts(in *ChainInput, j int, perWorker, poolTokenMs float64) (float64, float64) {
	sh := s.shape(in, j)
	m, speed := s.cal.model(in.Loads[j].Worker)
	var ms float64
	if m == &s.prior && speed == 1 { // the configured curves, computed as they always were
		ms = float64(sh.n-1)*s.prefill(s.chunk) + s.prefill(sh.rest)
		if sh.decoding {
			ms += float64(sh.n) * s.decode(sh.p)
		}
	} else {
		ms = float64(sh.n-1)*m.Prefill(s.chunk) + m.Prefill(sh.rest)
		if sh.decoding {
			ms += float64(sh.n) * m.Decode(sh.p)
		}
		ms = ms*speed + m.QueueMs
	}
	ext := s.ext
	if s.auto {
		ext = perWorker * ms
	}
	return ms, ext * float64(sh.uncached) * poolTokenMs
}

// features are candidate j's calibration features (calib.go): the prior's
// quadratic prefill, its linear and per-iteration prefill, its decode
// steps, in ms, and the queue's unit; and the sample's scale, the prior's
// prediction plus one full iteration: a request arriving while an
// iteration runs waits for its end, which the router does not see, so
// the error of a prediction is about proportional to it plus up to one
// iteration.
func (s *ttftScorer) features(in *ChainInput, j int) (x [calibParams]float64, scale float64) {
	sh := s.shape(in, j)
	c, r := float64(s.chunk), float64(sh.rest)
	x[0] = s.prior.PrefillQuad * (float64(sh.n-1)*c*c + r*r)
	x[1] = s.prior.PrefillLinear*float64(sh.work) + s.prior.PrefillFixed*float64(sh.n)
	if sh.decoding {
		x[2] = float64(sh.n) * s.prior.Decode(sh.p)
	}
	x[3] = calibQueueUnit
	return x, x[0] + x[1] + x[2] + s.prior.QueueMs + s.prior.Prefill(s.chunk)
}

// perWorker is the arrival rate per worker in requests/ms (ext=auto; 0
// otherwise), this request counted among the arrivals (as it will be on
// placement).
func (s *ttftScorer) perWorker(in *ChainInput) float64 {
	if !s.auto {
		return 0
	}
	return (s.rate.at(in.Now) + 1/TTFTRateWindow.Seconds()) / float64(max(in.PoolRanks, 1)) / 1000
}

func (s *ttftScorer) Score(in *ChainInput, cand []int, out []float64) {
	perWorker := s.perWorker(in)
	block := s.tokenMillis() * float64(in.BlockSize)
	pool := s.poolTokenMillis(in)
	for i, j := range cand {
		out[i] = s.millisAt(in, j, perWorker, pool) / block
	}
}

// Chosen counts a placement in the pool's arrival rate.
func (s *ttftScorer) Chosen(in *ChainInput, _ int) {
	if s.auto {
		s.rate.observe(in.Now)
	}
}

// rateEstimator counts events with an exponential decay of time constant
// TTFTRateWindow. Writers serialise on mu; readers never lock: a sequence
// counter (odd while a write is in progress) tells them to retry.
type rateEstimator struct {
	mu        sync.Mutex
	seq       atomic.Uint64
	perSecond atomic.Uint64 // float64 bits: the rate at last
	last      atomic.Int64  // UnixNano of the last event; 0: none yet
}

func decay(perSecond float64, from, to int64) float64 {
	if from == 0 || to <= from {
		return perSecond
	}
	return perSecond * math.Exp(-float64(to-from)/float64(TTFTRateWindow))
}

// observe counts one event at now.
func (r *rateEstimator) observe(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := now.UnixNano()
	last := r.last.Load()
	v := decay(math.Float64frombits(r.perSecond.Load()), last, t) + 1/TTFTRateWindow.Seconds()
	if t < last { // a clock stepping back: keep the later stamp
		t = last
	}
	r.seq.Add(1)
	r.perSecond.Store(math.Float64bits(v))
	r.last.Store(t)
	r.seq.Add(1)
}

// at returns the rate, in events/s, decayed to now.
func (r *rateEstimator) at(now time.Time) float64 {
	for {
		s := r.seq.Load()
		if s&1 != 0 {
			continue
		}
		v, last := math.Float64frombits(r.perSecond.Load()), r.last.Load()
		if r.seq.Load() == s {
			return decay(v, last, now.UnixNano())
		}
	}
}
