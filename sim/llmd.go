package sim

import (
	"fmt"
	"math"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvgate/kvgate/kvevents"
)

// KindLLMD is the llm-d inference scheduler's default scheduling profile,
// a peer baseline: the Gateway API Inference Extension's EPP with the
// plugins its InferencePool chart configures by default
// (kubernetes-sigs/gateway-api-inference-extension
// config/charts/inferencepool/templates/epp-config.yaml at 0ae94dfb,
// "default-plugins.yaml", the file llm-d's inference-scheduling guide
// deploys: llm-d/llm-d guides/inference-scheduling/gaie-inference-scheduling/values.yaml
// at 126f65d6, pluginsConfigFile "default-plugins.yaml"):
//
//	queue-scorer weight 2, kv-cache-utilization-scorer weight 2,
//	prefix-cache-scorer weight 3, and the max-score-picker.
//
// Each worker's score is the weighted sum; the highest wins, ties broken
// at random (max-score-picker shuffles, then sorts stably by score). The
// scorers, at GIE a172f54a (pkg/epp/scheduling/framework/plugins):
//
//   - queue-scorer (queuescorer/queue.go): (max − waiting) / (max − min)
//     over the candidates' waiting queues, 1 for all when they are equal;
//   - kv-cache-utilization-scorer (kvcacheutilizationscorer/kvcache_utilization.go):
//     1 − KV usage;
//   - prefix-cache-scorer (prefixcachescorer/plugin.go, indexer.go): the
//     prompt in blocks of 64 characters (DefaultBlockSize; with AutoTune,
//     the engine's block size × averageCharactersPerToken 4: 16 tokens
//     here, so llmdBlockTokens is one vLLM block of 16 tokens), chained
//     hashes of at most 256 blocks (DefaultMaxPrefixBlocks), matched
//     longest-prefix first against an approximate index: each pick adds
//     the request's hashes to the chosen server's LRU of 31,250 entries
//     (DefaultLRUCapacityPerServer; AutoTune would take the engine's
//     num_gpu_blocks, which these engines' metrics do not report). The
//     score is matched blocks / the request's blocks. As upstream, a block
//     counts for every server holding it as long as some server holds it.
//
// Waiting and KV usage are the scraped engine signals the local routers
// hold (scrape.go), with the same period and delay as every other policy.
// (llm-d's EPP itself refreshes them every 50 ms by default,
// DefaultRefreshMetricsInterval in GIE pkg/epp/server/runserver.go at
// 60c5ab8f: `--engine-scrape-period 50ms` replays that.)
const KindLLMD = "llm-d"

// The llm-d default profile's parameters (see KindLLMD for the sources).
const (
	llmdQueueWeight     = 2
	llmdKVWeight        = 2
	llmdPrefixWeight    = 3
	llmdBlockTokens     = 16 // 64 characters / 4 characters per token
	llmdMaxPrefixBlocks = 256
	llmdLRUCapacity     = 31250
)

// LLMD returns the llm-d baseline policy.
func LLMD() Policy { return Policy{Name: KindLLMD, Kind: KindLLMD} }

// llmdIndex is the prefix-cache-scorer's approximate index: one LRU of
// block hashes per worker and, per hash, the workers holding it (a bit
// per worker index).
type llmdIndex struct {
	lrus []*simplelru.LRU[uint64, struct{}]
	pods map[uint64]uint64
}

func newLLMDIndex(workers int) (*llmdIndex, error) {
	if workers > 64 {
		return nil, fmt.Errorf("%w: the llm-d baseline replays at most 64 workers, not %d", ErrConfig, workers)
	}
	x := &llmdIndex{lrus: make([]*simplelru.LRU[uint64, struct{}], workers), pods: make(map[uint64]uint64)}
	for i := range x.lrus {
		bit := uint64(1) << i
		x.lrus[i], _ = simplelru.NewLRU(llmdLRUCapacity, func(h uint64, _ struct{}) {
			if m := x.pods[h] &^ bit; m == 0 {
				delete(x.pods, h)
			} else {
				x.pods[h] = m
			}
		})
	}
	return x, nil
}

// llmdHashes are request idx's chained block hashes at llmdBlockTokens,
// at most llmdMaxPrefixBlocks of them.
func (r *run) llmdHashes(idx int) []uint64 {
	local := r.wl.hashes[idx]
	if r.wl.blockSize != llmdBlockTokens {
		local, _ = kvevents.AppendLocalHashes(nil, r.wl.tokens(idx), llmdBlockTokens, "")
	}
	if len(local) > llmdMaxPrefixBlocks {
		local = local[:llmdMaxPrefixBlocks]
	}
	return kvevents.AppendSequenceHashes(nil, local)
}

// chooseLLMD scores every worker of pools as llm-d's default profile does
// and records the request's blocks on the one picked.
func (r *run) chooseLLMD(pools []*simPool, idx int) (*worker, error) {
	if r.llmd == nil {
		x, err := newLLMDIndex(len(r.workers))
		if err != nil {
			return nil, err
		}
		r.llmd = x
	}
	hashes := r.llmdHashes(idx)
	// matchLongestPrefix: walk the blocks while any server holds one.
	matched := make(map[int]int)
	for _, h := range hashes {
		m := r.llmd.pods[h]
		if m == 0 {
			break
		}
		for i := range r.workers {
			if m&(1<<i) != 0 {
				matched[i]++
			}
		}
	}
	type cand struct {
		w       *worker
		waiting float64
		kv      float64
	}
	var cands []cand
	minQ, maxQ := math.Inf(1), math.Inf(-1)
	for _, p := range pools {
		for _, w := range p.workers {
			c := cand{w: w}
			if s, ok := p.router.EngineSignals(w.key); ok {
				c.waiting, c.kv = s.Waiting, s.KVUsage
			}
			minQ, maxQ = math.Min(minQ, c.waiting), math.Max(maxQ, c.waiting)
			cands = append(cands, c)
		}
	}
	var best *worker
	bestScore, ties := math.Inf(-1), 0
	for _, c := range cands {
		queue := 1.0
		if maxQ != minQ {
			queue = (maxQ - c.waiting) / (maxQ - minQ)
		}
		prefix := 0.0
		if len(hashes) > 0 {
			prefix = float64(matched[c.w.index]) / float64(len(hashes))
		}
		score := llmdQueueWeight*queue + llmdKVWeight*(1-c.kv) + llmdPrefixWeight*prefix
		switch {
		case score > bestScore:
			best, bestScore, ties = c.w, score, 1
		case score == bestScore:
			ties++
			if r.rng.IntN(ties) == 0 {
				best = c.w
			}
		}
	}
	// PreRequest: the picked server now holds the request's blocks.
	lru, bit := r.llmd.lrus[best.index], uint64(1)<<best.index
	for _, h := range hashes {
		lru.Add(h, struct{}{})
		r.llmd.pods[h] |= bit
	}
	return best, nil
}
