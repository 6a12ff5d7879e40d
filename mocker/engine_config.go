package mocker

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/membership"
)

// Config sizes and shapes an Engine. The zero value of each field means its
// default.
type Config struct {
	// BlockSize is the KV block size in tokens (16).
	BlockSize int
	// NumBlocks is the KV cache capacity in blocks (8192).
	NumBlocks int
	// MaxNumSeqs bounds the running sequences (256).
	MaxNumSeqs int
	// MaxNumBatchedTokens bounds the tokens computed per iteration (8192);
	// longer prompts are prefilled in chunks.
	MaxNumBatchedTokens int
	// DisablePrefixCaching turns off prefix reuse and KV events.
	DisablePrefixCaching bool
	// Role is membership.RoleAggregated (default), RolePrefill (every request
	// stops after its first token) or RoleDecode (requests with
	// RemotePrefill skip local prefill and pay a KV transfer instead).
	Role membership.Role
	// Timing prices iterations; nil means DefaultTiming{Speedup: Speedup}.
	Timing Timing
	// Speedup divides the default timing model's durations (1).
	Speedup float64
	// KVBytesPerToken is the KV size of one token, for transfer times
	// (131072: a Llama-3-8B-like model in fp16).
	KVBytesPerToken float64
	// KVTransferBandwidth is the prefill → decode bandwidth in bytes/s
	// (25e9).
	KVTransferBandwidth float64
	// Vocab is the range of generated token ids (32000).
	Vocab int
	// CPUBlocks is the capacity of a host-memory (CPU) KV tier in blocks
	// (0: none), as vLLM's CPU offloading or LMCache keeps one: a cached
	// block evicted from the GPU is offloaded there (Stored with medium CPU,
	// then Removed from the GPU), the tier evicts least recently used, and
	// a prefix found there is reloaded instead of recomputed.
	CPUBlocks int
	// CPUReloadBandwidth is the CPU → GPU bandwidth of a reload in bytes/s
	// (25e9, PCIe 4.0 x16): reloading t tokens takes t × KVBytesPerToken /
	// CPUReloadBandwidth, much less than prefilling them.
	CPUReloadBandwidth float64
	// KVHoldTimeout is how long a P/D prefill's blocks stay pinned for a
	// decode worker that never pulls them (480 s: vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT default, vllm/envs.py).
	KVHoldTimeout time.Duration
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BlockSize, 16)
	def(&c.NumBlocks, 8192)
	def(&c.MaxNumSeqs, 256)
	def(&c.MaxNumBatchedTokens, 8192)
	def(&c.Vocab, 32000)
	if c.Role == "" {
		c.Role = membership.RoleAggregated
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.Timing == nil {
		c.Timing = DefaultTiming{Speedup: c.Speedup}
	}
	if c.KVBytesPerToken == 0 {
		c.KVBytesPerToken = 131072
	}
	if c.KVTransferBandwidth == 0 {
		c.KVTransferBandwidth = 25e9
	}
	if c.CPUReloadBandwidth == 0 {
		c.CPUReloadBandwidth = 25e9
	}
	if c.KVHoldTimeout == 0 {
		c.KVHoldTimeout = 480 * time.Second
	}
	return c
}

// Validate reports a configuration the engine cannot run.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.BlockSize < 0 || c.NumBlocks < 0 || c.MaxNumSeqs < 0 || c.MaxNumBatchedTokens < 0 || c.Vocab < 0:
		return fmt.Errorf("%w: sizes must not be negative", ErrConfig)
	case c.MaxNumBatchedTokens < c.BlockSize:
		return fmt.Errorf("%w: max batched tokens %d below block size %d", ErrConfig, c.MaxNumBatchedTokens, c.BlockSize)
	case c.Speedup < 0:
		return fmt.Errorf("%w: speedup %v must be positive", ErrConfig, c.Speedup)
	case c.KVHoldTimeout < 0:
		return fmt.Errorf("%w: kv hold timeout %v must not be negative", ErrConfig, c.KVHoldTimeout)
	case c.CPUBlocks < 0:
		return fmt.Errorf("%w: cpu blocks %d must not be negative", ErrConfig, c.CPUBlocks)
	case c.KVBytesPerToken < 0 || c.KVTransferBandwidth < 0 || c.CPUReloadBandwidth < 0:
		return fmt.Errorf("%w: kv transfer parameters must be positive", ErrConfig)
	}
	switch c.Role {
	case membership.RoleAggregated, membership.RolePrefill, membership.RoleDecode:
	default:
		return fmt.Errorf("%w: unknown role %q (want aggregated, prefill or decode)", ErrConfig, c.Role)
	}
	return nil
}

// Errors of the engine core.
var (
	// ErrConfig reports an invalid Config.
	ErrConfig = errors.New("invalid mocker config")
	// ErrBadRequest reports a request the engine refuses: empty id or
	// prompt, MaxTokens ≤ 0, a duplicate id.
	ErrBadRequest = errors.New("bad request")
	// ErrTooLong reports a request whose prompt plus MaxTokens could never
	// fit in the KV cache.
	ErrTooLong = errors.New("request does not fit in the kv cache")
)
