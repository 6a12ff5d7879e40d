package localrouter

import (
	"fmt"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// SetEngineSignals replaces worker id's engine signals with ranks (the
// samples of its ranks, as signals.Parse returns them; nil forgets them).
// Ranks beyond the worker's dp_size, and workers that are not members,
// are ignored, except that a worker of one rank whose engine reports one
// rank takes it whatever its label (an engine run as one rank of a larger
// DP deployment labels it with its global rank). It implements
// signals.Sink; ranks is not retained.
func (r *Router) SetEngineSignals(id string, ranks map[uint32]signals.Sample) {
	r.setSignals(id, ranks, true)
}

// setSignals replaces id's samples; keep false drops them all.
func (r *Router) setSignals(id string, ranks map[uint32]signals.Sample, keep bool) {
	r.sigMu.Lock()
	defer r.sigMu.Unlock()
	old := *r.sig.Load()
	dp := r.members.Load().dp[id] // 0 for a non-member: nothing kept
	if !keep {
		dp = 0
	}
	next := make(map[WorkerKey]signals.Sample, len(old)+len(ranks))
	changed := false
	for k, v := range old {
		if k.ID == id {
			changed = true
			continue
		}
		next[k] = v
	}
	for rank, smp := range ranks {
		if dp == 1 && len(ranks) == 1 {
			// One rank per registration (vLLM's external DP load
			// balancing: each server is one rank, labelled with its
			// global index): the one reported is the worker's.
			rank = 0
		}
		if int(rank) < dp {
			k := WorkerKey{ID: id, DPRank: rank}
			next[k] = smp
			changed = true
			// The engine's latency histograms feed the ttft scorer's
			// calibration (calib_hist.go). Lock order: sigMu, then the
			// calibration's.
			r.chain.timing.cal.engineLatency(k, smp)
		}
	}
	if changed {
		r.sig.Store(&next)
	}
}

// EngineSignals returns the engine signals of rank k, if scraped.
func (r *Router) EngineSignals(k WorkerKey) (signals.Sample, bool) {
	s, ok := (*r.sig.Load())[k]
	return s, ok
}

// SaturationSkips counts ranks BestWorker left out because their engine
// reported saturation (the saturation filter of the worker chain), for
// placed requests.
func (r *Router) SaturationSkips() uint64 { return r.saturationSkips.Load() }

// Saturation returns why a rank with engine signals s is saturated under
// cfg's thresholds, or "" when it is not (or both thresholds are 0).
func (c Config) Saturation(s signals.Sample) string {
	if c.SaturationWaiting > 0 && s.Waiting >= float64(c.SaturationWaiting) {
		return fmt.Sprintf("engine saturated: %g requests waiting (saturation_waiting %d)", s.Waiting, c.SaturationWaiting)
	}
	if c.SaturationKVUsage > 0 && s.HasKVUsage && s.KVUsage >= c.SaturationKVUsage && s.Waiting > 0 {
		return fmt.Sprintf("engine saturated: KV usage %.3f (saturation_kv_usage %g) with %g requests waiting", s.KVUsage, c.SaturationKVUsage, s.Waiting)
	}
	return ""
}

// SignalsReport is the engine-signal side of a BestWorker choice, filled
// in when BestWorkerOptions.Signals points at one (routing.SignalsReport).
type SignalsReport = routing.SignalsReport

// Skip is a rank BestWorker left out, and why (routing.Skip).
type Skip = routing.Skip
