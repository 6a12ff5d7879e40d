package sim

import (
	"context"
	"math"
	"time"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/policies"
)

// ttftModel is the predicted-TTFT scorer's view of a worker: the engine's
// timing model (mocker.DefaultTiming, divided by the speedup), its chunk
// size and its KV capacity.
type ttftModel struct {
	chunk    int     // max_num_batched_tokens
	kvBlocks float64 // KV capacity in blocks
	speedup  float64
	// ext weighs the GPU time of the request's own uncached prefill, the
	// delay it imposes on the requests behind it (Policy.Externality).
	ext float64
	// perWorkerRate, when positive (Policy.ExtAuto), replaces ext on each
	// worker by the number of requests expected to arrive there before
	// this one's first token: the arrival rate per worker (requests/ms)
	// times the predicted TTFT.
	perWorkerRate float64
}

// rateWindow is the arrival-rate estimator's time constant.
const rateWindow = 10 * time.Second

// arrivalRate estimates a pool's request arrival rate online: arrivals
// counted with an exponential decay of time constant rateWindow, as a
// router can count the requests it is asked to place.
type arrivalRate struct {
	perSecond float64
	last      time.Time
	seen      bool
}

// observe counts one arrival at now and returns the rate in requests/s.
func (a *arrivalRate) observe(now time.Time) float64 {
	if a.seen {
		a.perSecond *= math.Exp(-now.Sub(a.last).Seconds() / rateWindow.Seconds())
	}
	a.perSecond += 1 / rateWindow.Seconds()
	a.last, a.seen = now, true
	return a.perSecond
}

// tokenMillis is the prefill time of one token in a full chunk, the
// engine's prefill throughput.
func (m ttftModel) tokenMillis() float64 {
	return mocker.PrefillMillis(m.chunk) / float64(m.chunk) / m.speedup
}

// score is the predicted cost, in ms, of placing the request on the worker
// of load l: the time to its first token there (every prefill token ahead
// of it and its own uncached ones, in chunks, each iteration also paying a
// decode step at the worker's KV occupancy while it has requests running)
// plus ext × the GPU time of its own uncached tokens.
func (m ttftModel) score(l localrouter.PotentialLoad, isl, blockSize int) float64 {
	work := max(l.PotentialPrefillTokens, 1) // at least one token is computed
	n := (work + m.chunk - 1) / m.chunk
	ms := float64(n-1)*mocker.PrefillMillis(m.chunk) + mocker.PrefillMillis(work-(n-1)*m.chunk)
	if l.ActiveRequests > 0 {
		p := math.Min(float64(l.PotentialDecodeBlocks)/m.kvBlocks, 1)
		ms += float64(n) * mocker.DecodeMillis(p)
	}
	ms /= m.speedup
	uncached := max(isl-l.OverlapBlocks*blockSize, 1)
	ext := m.ext
	if m.perWorkerRate > 0 {
		ext = m.perWorkerRate * ms
	}
	return ms + ext*float64(uncached)*m.tokenMillis()
}

// chooseTTFT places a request under a KindTTFT policy: in each pool the
// worker of the lowest score (ties at random); across pools, the global
// router's cost policy ranks each pool's best, its cost given in blocks of
// prefill time so that policies.Cost's normalisation to tokens keeps it in
// prefill-time units.
func (r *run) chooseTTFT(ctx context.Context, pools []*pool, req localrouter.Request, isl int, id string) (*worker, error) {
	m := ttftModel{chunk: r.cfg.MaxNumBatchedTokens, kvBlocks: float64(r.cfg.KVTokens / r.cfg.BlockSize), speedup: r.cfg.Speedup, ext: r.policy.Externality}
	if r.policy.ExtAuto {
		if r.rates == nil {
			r.rates = map[*pool]*arrivalRate{}
		}
		a := r.rates[pools[0]]
		if a == nil {
			a = &arrivalRate{}
			r.rates[pools[0]] = a
		}
		n := 0
		for _, p := range pools {
			n += len(p.workers)
		}
		m.perWorkerRate = a.observe(r.now) / float64(n) / 1000
	}
	type best struct {
		w     *worker
		score float64
	}
	bests := make([]best, 0, len(pools))
	for _, p := range pools {
		loads, err := p.router.PotentialLoads(ctx, req)
		if err != nil {
			return nil, err
		}
		b, ties := best{score: math.Inf(1)}, 0
		for _, l := range loads {
			s := m.score(l, isl, r.cfg.BlockSize)
			switch {
			case s < b.score:
				b, ties = best{p.byKey[l.Worker], s}, 1
			case s == b.score:
				ties++
				if r.rng.IntN(ties) == 0 {
					b.w = p.byKey[l.Worker]
				}
			}
		}
		bests = append(bests, b)
	}
	if len(bests) == 1 {
		return bests[0].w, nil
	}
	blockMillis := m.tokenMillis() * float64(r.cfg.BlockSize)
	cands := make([]policies.Candidate, 0, len(bests))
	byPool := make(map[string]*worker, len(bests))
	for _, b := range bests {
		key := b.w.key
		sel, err := b.w.pool.router.BestWorker(ctx, req, localrouter.BestWorkerOptions{Worker: &key})
		if err != nil {
			return nil, err
		}
		sel.ISL, sel.Cost = isl, b.score/blockMillis
		byPool[b.w.pool.name] = b.w
		cands = append(cands, policies.Candidate{
			Pool: b.w.pool.name, Role: policies.RoleAggregated, Weight: 1,
			Health: policies.Health{Routers: 1, Available: 1},
			Probe:  sel,
		})
	}
	ranked, err := r.poolChain.Rank(&policies.Request{ID: id, ISL: isl}, cands, nil)
	if err != nil {
		return nil, err
	}
	return byPool[ranked[0].Pool], nil
}
