package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/signals"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/policies"
)

// worker is one simulated engine and its place in the topology.
type worker struct {
	index int // in cluster.workers
	key   localrouter.WorkerKey
	pool  *simPool
	eng   *mocker.Engine
	// busy accumulates the engine's iteration times (meteredTiming).
	busy *time.Duration
	// eventID is the id of the last KV event sent to the router.
	eventID uint64
	// wake is when the engine asked to be stepped next (zero: idle).
	wake time.Time
	// ttft is the engine's time to first token histogram's totals, as its
	// metrics would report them (scrape.go).
	ttft signals.HistogramTotals
}

// simPool is a set of workers behind one local router.
type simPool struct {
	name    string
	role    membership.Role
	router  *localrouter.Router
	workers []*worker
	byKey   map[localrouter.WorkerKey]*worker
}

// meteredTiming prices iterations with the engine's model and adds each
// duration to a worker's busy time. The engine calls IterationTime exactly
// once per iteration, so the sum is the time the worker computed.
type meteredTiming struct {
	model mocker.Timing
	busy  *time.Duration
}

func (m meteredTiming) IterationTime(b mocker.Batch) time.Duration {
	d := m.model.IterationTime(b)
	*m.busy += d
	return d
}

// buildPools makes the pools of topology t for policy p: routers with the
// policy's cost parameters, workers with their engines.
func (r *run) buildPools() error {
	cfg, t := r.cfg, r.topo
	type spec struct {
		name string
		role membership.Role
		n    int
	}
	var specs []spec
	switch t.Kind {
	case TopologyFlat:
		specs = []spec{{"pool", membership.RoleAggregated, cfg.Workers}}
	case TopologyPools:
		for i := range t.Pools {
			specs = append(specs, spec{fmt.Sprintf("pool-%d", i), membership.RoleAggregated, cfg.Workers / t.Pools})
		}
	case TopologyDisagg:
		specs = []spec{
			{"prefill", membership.RolePrefill, t.PrefillWorkers},
			{"decode", membership.RoleDecode, cfg.Workers - t.PrefillWorkers},
		}
	}
	timings := engineTimings(cfg)
	for _, s := range specs {
		rc := r.policy.routerConfig(cfg.BlockSize, cfg.PredictedTTL)
		if r.policy.Kind == KindTTFT {
			rc.WorkerChain = r.policy.ttftChain(cfg)
		}
		rt, err := localrouter.New(rc, localrouter.Options{
			Clock:         func() time.Time { return r.now },
			Rand:          r.routerRand,
			Logger:        discardLogger,
			SweepInterval: -1,
		})
		if err != nil {
			return err
		}
		p := &simPool{name: s.name, role: s.role, router: rt, byKey: make(map[localrouter.WorkerKey]*worker)}
		for range s.n {
			w := &worker{index: len(r.workers), pool: p, busy: new(time.Duration)}
			w.key = localrouter.WorkerKey{ID: fmt.Sprintf("w%d", w.index)}
			w.eng, err = mocker.NewEngine(mocker.Config{
				BlockSize:           cfg.BlockSize,
				NumBlocks:           cfg.KVTokens / cfg.BlockSize,
				CPUBlocks:           cfg.CPUKVTokens / cfg.BlockSize,
				MaxNumSeqs:          cfg.MaxNumSeqs,
				MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
				Role:                s.role,
				Timing:              cfg.engineTiming(w.index, w.busy),
				Speedup:             cfg.workerSpeedup(w.index),
			})
			if err != nil {
				return err
			}
			rt.AddWorker(w.key.ID, 1)
			p.workers = append(p.workers, w)
			p.byKey[w.key] = w
			r.workers = append(r.workers, w)
		}
		if err := r.policy.pinOracle(p, timings, cfg.MaxNumBatchedTokens); err != nil {
			return err
		}
		if r.policy.Kind == KindTTFT && r.policy.Calibration == CalibrationHistograms {
			rt.SetLifecycleSamples(false)
		}
		r.pools = append(r.pools, p)
	}
	if len(r.pools) > 1 {
		reg := policies.NewRegistry()
		if err := policies.RegisterBuiltins(reg); err != nil {
			return err
		}
		var err error
		if r.poolChain, err = reg.Build([]policies.Spec{{Name: policies.NameCost}}, nil); err != nil {
			return err
		}
	}
	return nil
}

// candidates returns the pools a request may go to in its current phase:
// the prefill pool then the decode pool when disaggregated, else every pool.
func (r *run) candidates(decode bool) []*simPool {
	if r.topo.Kind != TopologyDisagg {
		return r.pools
	}
	if decode {
		return r.pools[1:2]
	}
	return r.pools[0:1]
}

// choose places request idx on a worker of one of pools and records it on
// that pool's router under id. It is the global router's step (pool
// selection) and the local router's (worker selection) in one.
func (r *run) choose(ctx context.Context, pools []*simPool, idx int, id string) (*worker, error) {
	req := r.routerRequest(idx)
	var w *worker
	switch r.policy.Kind {
	case KindRandom:
		n := 0
		for _, p := range pools {
			n += len(p.workers)
		}
		w = nth(pools, r.rng.IntN(n))
	case KindRoundRobin:
		n := 0
		for _, p := range pools {
			n += len(p.workers)
		}
		w = nth(pools, r.rr%n)
		r.rr++
	case KindLeastLoaded:
		best, ties := -1, 0
		for _, p := range pools {
			for _, cand := range p.workers {
				a := p.router.Active().Load(cand.key).ActiveRequests
				switch {
				case w == nil || a < best:
					w, best, ties = cand, a, 1
				case a == best:
					ties++
					if r.rng.IntN(ties) == 0 {
						w = cand
					}
				}
			}
		}
	case KindLLMD:
		var err error
		if w, err = r.chooseLLMD(pools, idx); err != nil {
			return nil, err
		}
	case KindKVOverlap:
		best, ties := -1, 0
		for _, p := range pools {
			loads, err := p.router.PotentialLoads(ctx, req)
			if err != nil {
				return nil, err
			}
			for _, l := range loads {
				switch {
				case l.OverlapBlocks > best:
					w, best, ties = p.byKey[l.Worker], l.OverlapBlocks, 1
				case l.OverlapBlocks == best:
					ties++
					if r.rng.IntN(ties) == 0 {
						w = p.byKey[l.Worker]
					}
				}
			}
		}
	case KindCost, KindTTFT:
		if len(pools) == 1 {
			// One pool: the local router decides and records in one call,
			// exactly as a flat deployment does.
			sel, err := pools[0].router.BestWorker(ctx, req, localrouter.BestWorkerOptions{RequestID: id})
			if err != nil {
				return nil, err
			}
			return pools[0].byKey[localrouter.Selected(sel)], nil
		}
		// Several pools: probe each with a state-free BestWorker and let
		// the global router's cost policy (policies.Cost: lowest cost, the
		// predicted ms whatever the chain) rank the pools, as the global
		// router does.
		cands := make([]policies.Candidate, 0, len(pools))
		byPool := make(map[string]*simPool, len(pools))
		for _, p := range pools {
			sel, err := p.router.BestWorker(ctx, req, localrouter.BestWorkerOptions{})
			if err != nil {
				return nil, err
			}
			byPool[p.name] = p
			// The candidate's arithmetic (cached and uncached tokens) is
			// routing.Selection's, as in the global router.
			sel.ISL = r.wl.reqs[idx].InputLength
			cands = append(cands, policies.Candidate{
				Pool: p.name, Role: policies.RoleAggregated, Weight: 1,
				Health: policies.Health{Routers: 1, Available: 1},
				Probe:  sel,
			})
		}
		ranked, err := r.poolChain.Rank(&policies.Request{ID: id, ISL: r.wl.reqs[idx].InputLength}, cands, nil)
		if err != nil {
			return nil, err
		}
		best := ranked[0]
		p := byPool[best.Pool]
		w = p.byKey[localrouter.WorkerKey{ID: best.Probe.WorkerID, DPRank: best.Probe.DPRank}]
	}
	key := w.key
	if _, err := w.pool.router.BestWorker(ctx, req, localrouter.BestWorkerOptions{RequestID: id, Worker: &key}); err != nil {
		return nil, err
	}
	return w, nil
}

// nth returns the i-th worker of pools taken in order.
func nth(pools []*simPool, i int) *worker {
	for _, p := range pools {
		if i < len(p.workers) {
			return p.workers[i]
		}
		i -= len(p.workers)
	}
	panic("sim: worker index out of range")
}
