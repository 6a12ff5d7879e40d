package localrouter

import (
	"fmt"
	"math"
	"sync"
)

// The built-in filters and scorers, registered by RegisterBuiltinScorers
// (scorer_registry.go). Each one's formula is in its doc comment and in
// docs/localrouter.md ("Worker chain").

const (
	saturationName = "saturation"
	ttftName       = "ttft"
	costName       = "cost"
	waitingName    = "waiting"
	runningName    = "running"
	kvUsageName    = "kv-usage"
)

// saturationFilter leaves out the ranks whose engine reports saturation
// (Config.Saturation: waiting ≥ waiting, or KV usage ≥ kv_usage with
// requests waiting). Args waiting and kv_usage replace the Config's
// saturation_waiting and saturation_kv_usage; without them and with both
// at 0 it leaves none out.
type saturationFilter struct{ cfg Config }

func newSaturationFilter(a *ChainArgs) (Filter, error) {
	cfg := a.Config
	w, err := a.Float("waiting", float64(cfg.SaturationWaiting))
	if err != nil {
		return nil, err
	}
	kv, err := a.Float("kv_usage", cfg.SaturationKVUsage)
	if err != nil {
		return nil, err
	}
	if w < 0 || w != math.Trunc(w) {
		return nil, fmt.Errorf("%w: worker chain %q: waiting %g must be a count ≥ 0", ErrInvalidConfig, a.Entry, w)
	}
	if !(kv >= 0 && kv <= 1) {
		return nil, fmt.Errorf("%w: worker chain %q: kv_usage %g must be within 0..1", ErrInvalidConfig, a.Entry, kv)
	}
	cfg.SaturationWaiting, cfg.SaturationKVUsage = int(w), kv
	return saturationFilter{cfg}, nil
}

func (f saturationFilter) Skip(in *ChainInput, j int) string {
	l := &in.Loads[j]
	if !l.HasEngine {
		return ""
	}
	return f.cfg.Saturation(l.Engine)
}

// loraFilter keeps only the ranks with the request's adapter loaded
// (among the adapters of their running or waiting requests, vLLM's
// vllm:lora_requests_info); when none has it (or the request names none)
// it leaves none out.
type loraFilter struct{}

func (loraFilter) Skip(in *ChainInput, j int) string {
	if in.LoRA == "" {
		return ""
	}
	l := &in.Loads[j]
	if l.HasEngine && l.Engine.HasLoRA {
		if r, w := l.Engine.HasAdapter(in.LoRA); r || w {
			return ""
		}
	}
	return "LoRA adapter " + in.LoRA + " not loaded"
}

// costScorer is Dynamo's cost, the Router's formula (Config.Cost docs):
// prefill_load_scale * max(0, prefill_blocks - overlap_score_credit *
// overlap) + decode_blocks + the engine-signal term, in blocks. Arg
// normalize=max divides it by the candidates' largest cost; args credit
// and scale replace the Config's overlap_score_credit and
// prefill_load_scale for the pool (a request's override still wins).
type costScorer struct {
	normalize     bool
	credit, scale *float64
}

func newCostScorer(a *ChainArgs) (Scorer, error) {
	s := &costScorer{}
	n, err := a.String("normalize", "none", "none", "max")
	if err != nil {
		return nil, err
	}
	s.normalize = n == "max"
	for _, p := range []struct {
		key string
		dst **float64
	}{{"credit", &s.credit}, {"scale", &s.scale}} {
		if !a.Has(p.key) {
			a.used[p.key] = true
			continue
		}
		f, err := a.Float(p.key, 0)
		if err != nil {
			return nil, err
		}
		if f < 0 {
			return nil, fmt.Errorf("%w: worker chain %q: %s %g must be ≥ 0", ErrInvalidConfig, a.Entry, p.key, f)
		}
		*p.dst = &f
	}
	return s, nil
}

func (s *costScorer) Score(in *ChainInput, cand []int, out []float64) {
	for i, j := range cand {
		out[i] = in.Costs[j]
	}
	if s.normalize {
		byMax(out)
	}
}

// byMax divides out by its largest value (all 0 when it is ≤ 0).
func byMax(out []float64) {
	hi := 0.0
	for _, v := range out {
		hi = max(hi, v)
	}
	for i := range out {
		if hi > 0 {
			out[i] /= hi
		} else {
			out[i] = 0
		}
	}
}

// prefixScorer rewards the cached prefix: -overlap / request_blocks, in
// [-1, 0], overlap in GPU-block equivalents (lower tiers at their
// TierWeights, predicted entries included).
type prefixScorer struct{}

func (prefixScorer) Score(in *ChainInput, cand []int, out []float64) {
	for i, j := range cand {
		out[i] = 0
		if in.RequestBlocks > 0 {
			out[i] = -min(in.Overlap[j], float64(in.RequestBlocks)) / float64(in.RequestBlocks)
		}
	}
}

// loadScorer is a load divided by the candidates' largest (0..1):
type loadScorer int

const (
	// prefillLoad: the worker's active prefill tokens (the prompts of its
	// requests still in prefill, this one excluded);
	prefillLoad loadScorer = iota
	// decodeLoad: its active decode blocks with this request's;
	decodeLoad
	// waitingLoad: its engine's waiting requests (0 where not scraped);
	waitingLoad
	// runningLoad: its engine's running requests (0 where not scraped).
	runningLoad
)

func (s loadScorer) Score(in *ChainInput, cand []int, out []float64) {
	for i, j := range cand {
		l := &in.Loads[j]
		switch s {
		case prefillLoad:
			out[i] = float64(activePrefill(*l, in.ISL, in.BlockSize))
		case decodeLoad:
			out[i] = float64(l.PotentialDecodeBlocks)
		case waitingLoad:
			out[i] = 0
			if l.HasEngine {
				out[i] = l.Engine.Waiting
			}
		case runningLoad:
			out[i] = 0
			if l.HasEngine {
				out[i] = l.Engine.Running
			}
		}
	}
	byMax(out)
}

// kvUsageScorer is the engine's KV cache usage, 0..1 (0 where not scraped
// or not reported).
type kvUsageScorer struct{}

func (kvUsageScorer) Score(in *ChainInput, cand []int, out []float64) {
	for i, j := range cand {
		l := &in.Loads[j]
		out[i] = 0
		if l.HasEngine && l.Engine.HasKVUsage {
			out[i] = l.Engine.KVUsage
		}
	}
}

// loraScorer prefers ranks with the request's adapter loaded: 0 where a
// running request uses it, 0.5 where only a waiting one does, 1 elsewhere
// (where the engine reports no LoRA information too); 0 for all when the
// request names no adapter (llm-d's and the Inference Extension's LoRA
// affinity, as a score).
type loraScorer struct{}

func (loraScorer) Score(in *ChainInput, cand []int, out []float64) {
	for i, j := range cand {
		out[i] = 0
		if in.LoRA == "" {
			continue
		}
		l := &in.Loads[j]
		out[i] = 1
		if l.HasEngine && l.Engine.HasLoRA {
			switch r, w := l.Engine.HasAdapter(in.LoRA); {
			case r:
				out[i] = 0
			case w:
				out[i] = 0.5
			}
		}
	}
}

// sessionScorer keeps a session on one worker: the request's session key
// is hashed onto the candidates by rendezvous (highest random weight)
// hashing, bounded by load (Mirrokni et al., consistent hashing with
// bounded loads): the session's worker is the highest-hashed candidate
// whose decode blocks are at most (1 + slack) times the candidates'
// mean. It scores 0, every other candidate 1; no session key: 0 for all.
// Arg slack (0.25).
type sessionScorer struct{ slack float64 }

func newSessionScorer(a *ChainArgs) (Scorer, error) {
	slack, err := a.Float("slack", 0.25)
	if err != nil {
		return nil, err
	}
	if slack < 0 {
		return nil, fmt.Errorf("%w: worker chain %q: slack %g must be ≥ 0", ErrInvalidConfig, a.Entry, slack)
	}
	return sessionScorer{slack}, nil
}

func (s sessionScorer) Score(in *ChainInput, cand []int, out []float64) {
	best := s.pick(in, cand)
	for i := range cand {
		out[i] = 0
		if best >= 0 && i != best {
			out[i] = 1
		}
	}
}

// pick returns the position in cand of the session's worker, -1 without a
// session key.
func (s sessionScorer) pick(in *ChainInput, cand []int) int {
	if in.SessionKey == "" || len(cand) == 0 {
		return -1
	}
	var sum float64
	for _, j := range cand {
		sum += float64(in.Loads[j].PotentialDecodeBlocks)
	}
	bound := (1 + s.slack) * sum / float64(len(cand))
	best, bestH := -1, uint64(0)
	for i, j := range cand {
		l := &in.Loads[j]
		if float64(l.PotentialDecodeBlocks) > bound {
			continue
		}
		if h := rendezvous(in.SessionKey, l.Worker); best < 0 || h > bestH {
			best, bestH = i, h
		}
	}
	return best
}

// rendezvous is a stable hash of (key, worker): FNV-1a, then a 64-bit
// finaliser (splitmix64) so that close inputs spread.
func rendezvous(key string, w WorkerKey) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	h = (h ^ 0xff) * prime
	for i := 0; i < len(w.ID); i++ {
		h = (h ^ uint64(w.ID[i])) * prime
	}
	h = (h ^ uint64(w.DPRank)) * prime
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// coldScorer spreads cold prompts (no candidate holds any of their
// blocks) over the workers, llm-d's no-hit-lru scorer
// (llm-d-inference-scheduler pkg/plugins/scorer/no_hit_lru.go): for a
// cold request each candidate's raw value is its rank in
// least-recently-chosen-for-a-cold-request order over (n - 1), 0 for the
// least recent (never chosen first), 1 for the most recent; for a request
// with a hit anywhere it is 0 for all (neutral). Only placed cold
// requests update the order. Arg lru_size (1024) bounds the workers
// remembered.
type coldScorer struct {
	size int
	mu   sync.Mutex
	seq  uint64
	last map[WorkerKey]uint64
}

func newColdScorer(a *ChainArgs) (Scorer, error) {
	n, err := a.Float("lru_size", 1024)
	if err != nil {
		return nil, err
	}
	if n < 1 || n != math.Trunc(n) || n > 1<<20 {
		return nil, fmt.Errorf("%w: worker chain %q: lru_size %g must be a count within 1..%d", ErrInvalidConfig, a.Entry, n, 1<<20)
	}
	return &coldScorer{size: int(n), last: map[WorkerKey]uint64{}}, nil
}

func (s *coldScorer) Score(in *ChainInput, cand []int, out []float64) {
	if !in.Cold || len(cand) < 2 {
		clear(out)
		return
	}
	// Rank each stamp among the others (ties share the lower rank): O(n²)
	// without allocating, n being a pool's ranks.
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(cand)
	for i, j := range cand {
		stamp, below := s.last[in.Loads[j].Worker], 0
		for _, k := range cand {
			if s.last[in.Loads[k].Worker] < stamp {
				below++
			}
		}
		out[i] = float64(below) / float64(n-1)
	}
}

func (s *coldScorer) Chosen(in *ChainInput, j int) {
	if !in.Cold {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.last[in.Loads[j].Worker] = s.seq
	if len(s.last) > s.size {
		var oldest WorkerKey
		first := true
		for k, v := range s.last {
			if first || v < s.last[oldest] {
				oldest, first = k, false
			}
		}
		delete(s.last, oldest)
	}
}
