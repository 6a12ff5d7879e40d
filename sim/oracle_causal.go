package sim

import (
	"slices"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/mocker"
)

// OracleBounds are hit-ratio bounds beside the report's two oracles.
type OracleBounds struct {
	// CausalCapacityOracleHitRatio is the capacity oracle (one LRU of the
	// pool's KV capacity serving every request) with causality: a
	// request's blocks enter the cache only once computed, at its arrival
	// plus the time an idle worker takes to prefill its uncached tokens
	// (no queueing, no batching with others: the earliest any routing
	// could have them), and a request hits only blocks entered by its
	// arrival. Requests sharing a prefix that arrive within one prefill
	// of each other miss it in every real deployment; the capacity oracle
	// counts them as hits.
	CausalCapacityOracleHitRatio float64 `json:"causal_capacity_oracle_hit_ratio"`
}

// causalCapacityOracleHitRatio is OracleBounds.CausalCapacityOracleHitRatio
// for capacityBlocks blocks, prefills priced by timing in chunks of budget.
func causalCapacityOracleHitRatio(wl *workload, capacityBlocks, budget int, timing mocker.Timing) float64 {
	if capacityBlocks < 1 {
		return 0
	}
	lru, _ := simplelru.NewLRU[uint64, struct{}](capacityBlocks, nil)
	// Pending insertions, by the time their blocks are computed.
	type ready struct {
		at  time.Duration
		idx int
	}
	var pending []ready // a min-heap would do; requests are few enough to keep it sorted
	seqs := make([][]uint64, len(wl.reqs))
	var hit, total int64
	insert := func(until time.Duration) {
		n := 0
		for n < len(pending) && pending[n].at <= until {
			seq := seqs[pending[n].idx]
			for b := len(seq) - 1; b >= 0; b-- {
				lru.Add(seq[b], struct{}{})
			}
			seqs[pending[n].idx] = nil
			n++
		}
		pending = pending[n:]
	}
	for i, req := range wl.reqs {
		insert(req.Arrival)
		seq := kvevents.AppendSequenceHashes(nil, wl.hashes[i])
		usable := (req.InputLength - 1) / wl.blockSize
		cached := 0
		for b := 0; b < usable && b < len(seq); b++ {
			if _, ok := lru.Get(seq[b]); !ok {
				break
			}
			cached += wl.blockSize
		}
		hit += int64(cached)
		total += int64(req.InputLength)
		seqs[i] = seq
		r := ready{at: req.Arrival + unloadedTTFT(req.InputLength-cached, budget, timing), idx: i}
		at, _ := slices.BinarySearchFunc(pending, r, func(a, b ready) int {
			if a.at <= b.at {
				return -1 // after every equal time: insertions keep arrival order
			}
			return 1
		})
		pending = slices.Insert(pending, at, r)
	}
	return ratio(float64(hit), float64(total))
}
