package localrouter

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// Config is a local router's configuration, Dynamo's KvRouterConfig plus the
// pool's block size. DefaultConfig returns the defaults; Validate checks it.
type Config struct {
	// BlockSize is the pool's KV block size in tokens (default 16).
	BlockSize int
	// OverlapScoreCredit weighs cached blocks against prefill work (1.0).
	OverlapScoreCredit float64
	// PrefillLoadScale weighs prefill work against decode load (1.0).
	PrefillLoadScale float64
	// RouterTemperature: 0 picks the cheapest worker; > 0 samples a softmax
	// over normalised negative costs.
	RouterTemperature float64
	// UseKVEvents: true keeps the index from engine KV events; false runs
	// the approximate index, learning from the router's own decisions.
	UseKVEvents bool
	// TrackActiveBlocks: count active decode blocks in the cost (true).
	TrackActiveBlocks bool
	// ReplicaSync: share lifecycle events with the pool's other router
	// replicas (false).
	ReplicaSync bool
	// TTL of approximate-mode index entries (120 s).
	TTL time.Duration
	// PredictedTTL: with KV events, the blocks of each request placed on a
	// worker are recorded there as predicted entries for this long, unless
	// the engine's Stored events confirm them first, so the next decision
	// sees them (10 s; 0 records none: the index is the events' alone).
	PredictedTTL time.Duration
	// Calibrate: the ttft scorer fits each worker rank's timing model
	// online from the first tokens it observes (calib.go; true). False
	// keeps the configured curves (the chain's ttft arguments, or the
	// defaults) for every rank; pinned models (Router.PinTiming) apply
	// either way. Read by the ttft scorer, and by Selection.Cost's
	// prediction whatever the chain.
	Calibrate bool
	// MaxTreeSize bounds approximate-mode index entries (2^20).
	MaxTreeSize int
	// MinInitialWorkers: not ready until this many workers joined (0).
	MinInitialWorkers int
	// RequestExpiry frees requests still active after this long, in case
	// their free was lost (300 s).
	RequestExpiry time.Duration

	// Engine signals (localrouter/signals), read only where a worker's
	// metrics are scraped; the zero values leave the cost and the choice
	// exactly as without them.

	// WaitingWeight adds this many blocks of cost per request waiting in
	// the engine's own queue (0).
	WaitingWeight float64
	// KVUsageWeight adds this many blocks of cost at a full KV cache,
	// proportionally below (0).
	KVUsageWeight float64
	// SaturationKVUsage: a rank whose engine reports KV usage ≥ this with
	// requests waiting is skipped (0 disables; e.g. 0.95).
	SaturationKVUsage float64
	// SaturationWaiting: a rank whose engine reports this many waiting
	// requests or more is skipped (0 disables).
	SaturationWaiting int
	// TierWeights is the credit a cached block earns on each cache tier,
	// relative to one held on the GPU (TierWeights[TierGPU] is always 1):
	// reloading a block from host memory or disk is cheaper than computing
	// it, dearer than finding it on the device. The defaults are llm-d's
	// (llm-d-kv-cache-manager DefaultKVCacheBackendConfig: gpu 1.0, cpu 0.8,
	// storage 0.3, object_store 0.2). All zero below the GPU: tiers are
	// ignored, as before kvgate indexed them.
	TierWeights [kvevents.NumTiers]float64

	// WorkerChain is how BestWorker ranks the pool's workers: filters and
	// weighted scorers (scorer.go; docs/localrouter.md "Worker chain").
	// Empty: DefaultWorkerChain, the saturation filter then the ttft
	// scorer; CostWorkerChain is Dynamo's cost, which the fields above
	// parameterise.
	WorkerChain []ScorerSpec
	// Scorers is the registry WorkerChain's entries are built from (nil:
	// BuiltinScorers). A program adds its own filters and scorers to
	// BuiltinScorers() and sets it here.
	Scorers *ScorerRegistry
}

// DefaultTierWeights are TierWeights' defaults (llm-d's).
var DefaultTierWeights = [kvevents.NumTiers]float64{kvevents.TierGPU: 1, kvevents.TierCPU: 0.8, kvevents.TierDisk: 0.3, kvevents.TierExternal: 0.2}

// ParseTierWeights parses "cpu=0.8,disk=0.3,external=0.2" (tier names or
// engine media; unnamed tiers keep DefaultTierWeights; "none" sets every
// lower tier to 0).
func ParseTierWeights(s string) ([kvevents.NumTiers]float64, error) {
	w := DefaultTierWeights
	s = strings.TrimSpace(s)
	if s == "" {
		return w, nil
	}
	if strings.EqualFold(s, "none") || s == "0" {
		for t := kvevents.TierCPU; t < kvevents.NumTiers; t++ {
			w[t] = 0
		}
		return w, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		t, known := kvevents.TierByName(strings.TrimSpace(name))
		if !ok || !known {
			return w, fmt.Errorf("%w: tier weight %q: want tier=weight with tier one of gpu, cpu, disk, external", ErrInvalidConfig, part)
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return w, fmt.Errorf("%w: tier weight %q: %v", ErrInvalidConfig, part, err)
		}
		w[t] = f
	}
	return w, nil
}

// FormatTierWeights writes w as ParseTierWeights reads it.
func FormatTierWeights(w [kvevents.NumTiers]float64) string {
	var b strings.Builder
	for t := kvevents.TierCPU; t < kvevents.NumTiers; t++ {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%g", t, w[t])
	}
	return b.String()
}

// DefaultConfig returns the defaults: Dynamo's cost parameters
// (overlap_score_credit 1, prefill_load_scale 1, router_temperature 0),
// which only the cost scorer reads, and the default worker chain
// (an empty WorkerChain: DefaultWorkerChain, saturation then ttft).
//
// ttft is kvgate's principled default (docs/replay-results.md, "Round 2,
// principled default"; scorer_ttft.go): the request's predicted TTFT on
// the worker plus the delay its cache misses impose on the requests
// arriving behind it, from the engine's timing model. It beats Dynamo's
// defaults on both target traces (Mooncake 6x mean TTFT 222 vs 382 ms,
// agentic 9x 129 vs 148 ms). Dynamo's choice: WorkerChain =
// CostWorkerChain() (-worker-chain cost).
func DefaultConfig() Config {
	return Config{
		BlockSize:          16,
		OverlapScoreCredit: 1,
		PrefillLoadScale:   1,
		UseKVEvents:        true,
		TrackActiveBlocks:  true,
		TTL:                120 * time.Second,
		PredictedTTL:       10 * time.Second,
		Calibrate:          true,
		MaxTreeSize:        1 << 20,
		RequestExpiry:      300 * time.Second,
		TierWeights:        DefaultTierWeights,
	}
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = routing.ErrInvalidConfig

// Validate reports the first field out of range.
func (c Config) Validate() error {
	switch {
	case c.BlockSize <= 0:
		return fmt.Errorf("%w: block_size %d must be positive", ErrInvalidConfig, c.BlockSize)
	case !(c.OverlapScoreCredit >= 0) || math.IsInf(c.OverlapScoreCredit, 0):
		return fmt.Errorf("%w: overlap_score_credit %g must be ≥ 0", ErrInvalidConfig, c.OverlapScoreCredit)
	case !(c.PrefillLoadScale >= 0) || math.IsInf(c.PrefillLoadScale, 0):
		return fmt.Errorf("%w: prefill_load_scale %g must be ≥ 0", ErrInvalidConfig, c.PrefillLoadScale)
	case !(c.RouterTemperature >= 0) || math.IsInf(c.RouterTemperature, 0):
		return fmt.Errorf("%w: router_temperature %g must be ≥ 0", ErrInvalidConfig, c.RouterTemperature)
	case c.TTL <= 0:
		return fmt.Errorf("%w: ttl %v must be positive", ErrInvalidConfig, c.TTL)
	case c.PredictedTTL < 0:
		return fmt.Errorf("%w: predicted_ttl %v must be ≥ 0", ErrInvalidConfig, c.PredictedTTL)
	case c.MaxTreeSize <= 0:
		return fmt.Errorf("%w: max_tree_size %d must be positive", ErrInvalidConfig, c.MaxTreeSize)
	case c.MinInitialWorkers < 0:
		return fmt.Errorf("%w: min_initial_workers %d must be ≥ 0", ErrInvalidConfig, c.MinInitialWorkers)
	case c.RequestExpiry <= 0:
		return fmt.Errorf("%w: request_expiry %v must be positive", ErrInvalidConfig, c.RequestExpiry)
	case !(c.WaitingWeight >= 0) || math.IsInf(c.WaitingWeight, 0):
		return fmt.Errorf("%w: waiting_weight %g must be ≥ 0", ErrInvalidConfig, c.WaitingWeight)
	case !(c.KVUsageWeight >= 0) || math.IsInf(c.KVUsageWeight, 0):
		return fmt.Errorf("%w: kv_usage_weight %g must be ≥ 0", ErrInvalidConfig, c.KVUsageWeight)
	case !(c.SaturationKVUsage >= 0 && c.SaturationKVUsage <= 1):
		return fmt.Errorf("%w: saturation_kv_usage %g must be within 0..1", ErrInvalidConfig, c.SaturationKVUsage)
	case c.SaturationWaiting < 0:
		return fmt.Errorf("%w: saturation_waiting %d must be ≥ 0", ErrInvalidConfig, c.SaturationWaiting)
	case c.TierWeights[kvevents.TierGPU] != 1 && c.TierWeights != [kvevents.NumTiers]float64{}:
		return fmt.Errorf("%w: tier_weights: the gpu weight is 1, got %g", ErrInvalidConfig, c.TierWeights[kvevents.TierGPU])
	}
	for t, w := range c.TierWeights {
		if !(w >= 0 && w <= 1) {
			return fmt.Errorf("%w: tier_weights: %s weight %g must be in [0, 1]", ErrInvalidConfig, kvevents.Tier(t), w)
		}
	}
	if len(c.WorkerChain) > 0 {
		return ValidateWorkerChain(c.WorkerChain, c)
	}
	return nil
}

// costParams are the cost function's parameters for one request.
type costParams struct {
	credit, scale, temperature float64
	trackBlocks                bool
	waitingWeight, kvWeight    float64
}

// tierCredit is the overlap, in GPU-block equivalents, of a worker's
// per-tier run (Matches.TiersOf): each block weighted by its tier.
func (c Config) tierCredit(tm TierMatch) float64 {
	x := float64(tm.Blocks[kvevents.TierGPU])
	for t := kvevents.TierCPU; t < kvevents.NumTiers; t++ {
		x += c.TierWeights[t] * float64(tm.Blocks[t])
	}
	return x
}

func (c Config) params(o *routing.Override) (costParams, error) {
	p := costParams{c.OverlapScoreCredit, c.PrefillLoadScale, c.RouterTemperature, c.TrackActiveBlocks, c.WaitingWeight, c.KVUsageWeight}
	if o == nil {
		return p, nil
	}
	if err := o.Validate(); err != nil {
		return p, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if o.OverlapScoreCredit != nil {
		p.credit = *o.OverlapScoreCredit
	}
	if o.PrefillLoadScale != nil {
		p.scale = *o.PrefillLoadScale
	}
	if o.RouterTemperature != nil {
		p.temperature = *o.RouterTemperature
	}
	return p, nil
}

// Cost is Dynamo's cost of placing a request on a worker:
//
//	prefill_blocks = (active_prefill_tokens + isl) / block_size
//	cost = prefill_load_scale * max(0, prefill_blocks - overlap_score_credit * overlap)
//	     + potential_decode_blocks
//
// activePrefill excludes this request; decodeBlocks includes it.
//
// overlap is in GPU-block equivalents: blocks on lower tiers count at their
// tier's weight (Config.TierWeights).
func (p costParams) cost(activePrefill, isl, blockSize int, overlap float64, decodeBlocks int) float64 {
	prefillBlocks := float64(activePrefill+isl) / float64(blockSize)
	pf := prefillBlocks - p.credit*overlap
	if pf < 0 {
		pf = 0
	}
	c := p.scale * pf
	if p.trackBlocks {
		c += float64(decodeBlocks)
	}
	return c
}

// engineCost is the engine-signal term added to cost when the worker's
// metrics are scraped:
//
//	waiting_weight * engine_waiting_requests + kv_usage_weight * engine_kv_usage
//
// Both weights default to 0: the cost is then Dynamo's, unchanged.
func (p costParams) engineCost(s signals.Sample) float64 {
	return p.waitingWeight*s.Waiting + p.kvWeight*s.KVUsage
}
