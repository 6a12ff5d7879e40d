package localrouter

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvgate/kvgate/api/routing"
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
}

// DefaultConfig returns Dynamo's defaults.
func DefaultConfig() Config {
	return Config{
		BlockSize:          16,
		OverlapScoreCredit: 1,
		PrefillLoadScale:   1,
		UseKVEvents:        true,
		TrackActiveBlocks:  true,
		TTL:                120 * time.Second,
		MaxTreeSize:        1 << 20,
		RequestExpiry:      300 * time.Second,
	}
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("invalid router config")

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
	}
	return nil
}

// costParams are the cost function's parameters for one request.
type costParams struct {
	credit, scale, temperature float64
	trackBlocks                bool
	waitingWeight, kvWeight    float64
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
func (p costParams) cost(activePrefill, isl, blockSize, overlap, decodeBlocks int) float64 {
	prefillBlocks := float64(activePrefill+isl) / float64(blockSize)
	pf := prefillBlocks - p.credit*float64(overlap)
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
