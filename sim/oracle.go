package sim

import (
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/mocker"
)

// oracleHitRatio is the prefix hit ratio of one infinite cache shared by
// every worker: a request hits every leading block whose prefix any earlier
// request's prompt contained. Like the engines, it counts complete blocks
// only and always computes the prompt's last token, so it bounds what any
// routing can reach on the simulated workers.
func oracleHitRatio(wl *workload) float64 {
	seen := make(map[uint64]struct{})
	var hit, total int64
	var seq []uint64
	for i, req := range wl.reqs {
		seq = kvevents.AppendSequenceHashes(seq[:0], wl.hashes[i])
		usable := (req.InputLength - 1) / wl.blockSize
		for b := 0; b < usable; b++ {
			if _, ok := seen[seq[b]]; !ok {
				break
			}
			hit += int64(wl.blockSize)
		}
		for _, h := range seq {
			seen[h] = struct{}{}
		}
		total += int64(req.InputLength)
	}
	return ratio(float64(hit), float64(total))
}

// capacityOracleHitRatio is the prefix hit ratio of one LRU cache holding
// capacityBlocks blocks — the pool's total KV capacity — that serves every
// request: what perfect routing without duplication could keep. Each
// request hits its leading blocks still cached (complete blocks, the last
// token always computed, as oracleHitRatio), then its blocks become the
// most recent, the first block most recent of all, so a cache under
// pressure drops prompts' tails before their shared heads, as vLLM's
// free-block queue does. It is no strict bound — LRU is not the optimal
// replacement, and requests are served one at a time — but it is what the
// workers' caches, added up, could keep.
func capacityOracleHitRatio(wl *workload, capacityBlocks int) float64 {
	if capacityBlocks < 1 {
		return 0
	}
	lru, _ := simplelru.NewLRU[uint64, struct{}](capacityBlocks, nil)
	var hit, total int64
	var seq []uint64
	for i, req := range wl.reqs {
		seq = kvevents.AppendSequenceHashes(seq[:0], wl.hashes[i])
		usable := (req.InputLength - 1) / wl.blockSize
		for b := 0; b < usable && b < len(seq); b++ {
			if !lru.Contains(seq[b]) {
				break
			}
			hit += int64(wl.blockSize)
		}
		for b := len(seq) - 1; b >= 0; b-- {
			lru.Add(seq[b], struct{}{})
		}
		total += int64(req.InputLength)
	}
	return ratio(float64(hit), float64(total))
}

// unloadedTTFT is a request's time to first token alone on an idle worker
// with a cold cache: its prompt prefilled in chunks of the batch budget.
func unloadedTTFT(isl, budget int, timing mocker.Timing) time.Duration {
	var d time.Duration
	for left := isl; left > 0; left -= budget {
		d += timing.IterationTime(mocker.Batch{PrefillTokens: min(left, budget)})
	}
	return d
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
