package kvevents

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// Block is one KV block an engine stored: its opaque engine hash and the
// token ids it holds (exactly one block's worth). A block may carry its
// kvgate LocalHash instead of token ids (index dumps do, since the index
// keeps hashes, not tokens); token ids win when both are present. A block
// of a lower-tier Stored (Medium not GPU) may carry neither: it is a copy
// of a block the worker announced on another tier under the same engine
// hash (vLLM's offloading connector), and the index finds it by that hash.
type Block struct {
	EngineHash uint64   `json:"engine_hash" msgpack:"engine_hash"`
	TokenIDs   []uint32 `json:"token_ids,omitempty" msgpack:"token_ids,omitempty"`
	LocalHash  *uint64  `json:"local_hash,omitempty" msgpack:"local_hash,omitempty"`
	// MMHashes are the content hashes (MMHash) of the multimodal items
	// whose placeholder tokens this block holds, sorted; they are part of
	// the block's key (BlockHashMM).
	MMHashes []uint64 `json:"mm_hashes,omitempty" msgpack:"mm_hashes,omitempty"`
}

// Stored reports blocks stored as a chain under the block whose engine hash
// is ParentHash (nil: the chain starts at the root). Blocks[i+1] is the child
// of Blocks[i].
type Stored struct {
	ParentHash *uint64 `json:"parent_hash,omitempty" msgpack:"parent_hash,omitempty"`
	Blocks     []Block `json:"blocks" msgpack:"blocks"`
	// LoRAName is the adapter the blocks were computed with, "" for the base
	// model.
	LoRAName string `json:"lora_name,omitempty" msgpack:"lora_name,omitempty"`
	// CacheSalt is the request's cache_salt the blocks were computed with
	// ("" for none); with LoRAName it makes the chain's seed (ChainSeed).
	CacheSalt string `json:"cache_salt,omitempty" msgpack:"cache_salt,omitempty"`
	// Medium is the cache tier holding the blocks ("" or "GPU": the
	// engine's device memory; see TierOf).
	Medium string `json:"medium,omitempty" msgpack:"medium,omitempty"`
}

// Removed reports blocks the engine evicted, by engine hash.
type Removed struct {
	EngineHashes []uint64 `json:"engine_hashes" msgpack:"engine_hashes"`
	// Medium is the tier the blocks left ("" or "GPU": device memory).
	Medium string `json:"medium,omitempty" msgpack:"medium,omitempty"`
}

// Tier is a KV cache tier: where an engine keeps a block. Lower tiers are
// cheaper to hold and slower to reload; a hit there still beats a
// recompute.
type Tier uint8

// The tiers, fastest first. Their order is the order of preference when a
// block is held in several.
const (
	TierGPU      Tier = iota // device memory: medium "", GPU, DEVICE
	TierCPU                  // host memory: CPU, CPU_PINNED, CPU_TIER1
	TierDisk                 // local storage: DISK, NVME, CPU_TIER2, STORAGE
	TierExternal             // shared or remote: EXTERNAL, NETWORK, REMOTE, SHARED, LMCACHE
	NumTiers
)

var tierNames = [NumTiers]string{"gpu", "cpu", "disk", "external"}

func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// TierOf maps an event's medium to its tier, as Dynamo's
// StorageTier::from_kv_medium does (lib/kv-router/src/protocols.rs), plus
// the names llm-d and LMCache use; case is ignored. ok is false for a
// medium it does not know.
func TierOf(medium string) (t Tier, ok bool) {
	switch strings.ToUpper(medium) {
	case "", "GPU", "DEVICE", "CUDA":
		return TierGPU, true
	case "CPU", "CPU_PINNED", "CPU_TIER1", "HOST", "HOST_PINNED":
		return TierCPU, true
	case "DISK", "NVME", "CPU_TIER2", "STORAGE", "SSD", "LOCAL_DISK":
		return TierDisk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED", "SHARED_STORAGE", "OBJECT_STORE", "LMCACHE":
		return TierExternal, true
	}
	return 0, false
}

// TierByName parses a tier name as String writes it, or any medium TierOf
// knows.
func TierByName(name string) (Tier, bool) {
	for i, n := range tierNames {
		if strings.EqualFold(name, n) {
			return Tier(i), true
		}
	}
	return TierOf(name)
}

// SkipNotice tells routers that the worker's engine events are being
// skipped before they reach them (by the relay's decoder), so a worker
// whose cache is invisible says why. It changes no index state.
type SkipNotice struct {
	// Reason is the kvevents.SkipReason, e.g. "block_size".
	Reason string `json:"reason" msgpack:"reason"`
	// Events is how many events were skipped so far for that reason.
	Events uint64 `json:"events" msgpack:"events"`
	// EngineBlockSize and BlockSize are the engine's block size and the
	// pool's, for Reason block_size.
	EngineBlockSize uint32 `json:"engine_block_size,omitempty" msgpack:"engine_block_size,omitempty"`
	BlockSize       uint32 `json:"block_size,omitempty" msgpack:"block_size,omitempty"`
}

// Message says what is wrong and which flag fixes it.
func (n SkipNotice) Message() string {
	if n.Reason == string(SkipBlockSize) {
		return BlockSizeAdvice(int(n.EngineBlockSize), int(n.BlockSize))
	}
	return fmt.Sprintf("%d engine events skipped (%s)", n.Events, n.Reason)
}

// BlockSizeAdvice explains a block size mismatch between an engine and its
// pool and names the flags that fix it.
func BlockSizeAdvice(engine, pool int) string {
	msg := fmt.Sprintf("the engine reports blocks of %d tokens but the pool's block size is %d, so nothing it caches is indexed; start the engine with the pool's block size (vLLM --block-size %d, SGLang --page-size %d) or set the pool's to the engine's (kvgate relay --block-size, kvgate localrouter --router-block-size / KVGATE_ROUTER_BLOCK_SIZE, the pools file's block_size)", engine, pool, pool, pool)
	if engine == 1 {
		msg += "; a block size of 1 is SGLang's default --page-size"
	}
	return msg
}

// Event is exactly one of Stored, Removed, Cleared (all blocks dropped) or
// Skipped (a notice that changes nothing in the index).
type Event struct {
	Stored  *Stored     `json:"stored,omitempty" msgpack:"stored,omitempty"`
	Removed *Removed    `json:"removed,omitempty" msgpack:"removed,omitempty"`
	Cleared bool        `json:"cleared,omitempty" msgpack:"cleared,omitempty"`
	Skipped *SkipNotice `json:"skipped,omitempty" msgpack:"skipped,omitempty"`
}

// RouterEvent is an Event from one (worker, data-parallel rank), with the
// event id the publisher stamped: ids are monotonic per (worker, dp_rank),
// starting at 1, so a gap is visible.
type RouterEvent struct {
	WorkerID string `json:"worker_id" msgpack:"worker_id"`
	DPRank   uint32 `json:"dp_rank" msgpack:"dp_rank"`
	EventID  uint64 `json:"event_id" msgpack:"event_id"`
	Event    Event  `json:"event" msgpack:"event"`
}

// Errors returned by Validate and the decoders; wrapped with detail.
var (
	ErrInvalidEvent = errors.New("invalid kv event")
)

// Kind names the event's variant: "stored", "removed", "cleared",
// "skipped", or "" if the event is not exactly one of them.
func (e Event) Kind() string {
	n := 0
	kind := ""
	if e.Stored != nil {
		n, kind = n+1, "stored"
	}
	if e.Removed != nil {
		n, kind = n+1, "removed"
	}
	if e.Cleared {
		n, kind = n+1, "cleared"
	}
	if e.Skipped != nil {
		n, kind = n+1, "skipped"
	}
	if n != 1 {
		return ""
	}
	return kind
}

// Validate checks the shape of the event: a worker id, exactly one variant,
// and for Stored at least one block with token ids. Block sizes are checked
// by the index, which knows its block size.
func (e RouterEvent) Validate() error {
	if e.WorkerID == "" {
		return fmt.Errorf("%w: empty worker_id", ErrInvalidEvent)
	}
	switch e.Event.Kind() {
	case "":
		return fmt.Errorf("%w: event %d of worker %q must be exactly one of stored, removed, cleared, skipped", ErrInvalidEvent, e.EventID, e.WorkerID)
	case "skipped":
		if e.Event.Skipped.Reason == "" {
			return fmt.Errorf("%w: skip notice %d of worker %q without a reason", ErrInvalidEvent, e.EventID, e.WorkerID)
		}
	case "stored":
		if len(e.Event.Stored.Blocks) == 0 {
			return fmt.Errorf("%w: stored event %d of worker %q has no blocks", ErrInvalidEvent, e.EventID, e.WorkerID)
		}
		tier, _ := TierOf(e.Event.Stored.Medium)
		for i, b := range e.Event.Stored.Blocks {
			if len(b.TokenIDs) == 0 && b.LocalHash == nil && tier == TierGPU {
				return fmt.Errorf("%w: stored event %d of worker %q: block %d has neither token ids nor a local hash", ErrInvalidEvent, e.EventID, e.WorkerID, i)
			}
		}
		if _, ok := TierOf(e.Event.Stored.Medium); !ok {
			return fmt.Errorf("%w: stored event %d of worker %q: unknown medium %q", ErrInvalidEvent, e.EventID, e.WorkerID, e.Event.Stored.Medium)
		}
	case "removed":
		if _, ok := TierOf(e.Event.Removed.Medium); !ok {
			return fmt.Errorf("%w: removed event %d of worker %q: unknown medium %q", ErrInvalidEvent, e.EventID, e.WorkerID, e.Event.Removed.Medium)
		}
	}
	return nil
}

// EncodeJSON returns the JSON encoding of e.
func EncodeJSON(e RouterEvent) ([]byte, error) { return json.Marshal(e) }

// DecodeJSON parses and validates one JSON-encoded RouterEvent. Unknown
// fields are ignored (newer publishers may add some).
func DecodeJSON(b []byte) (RouterEvent, error) {
	var e RouterEvent
	if err := json.Unmarshal(b, &e); err != nil {
		return RouterEvent{}, fmt.Errorf("%w: json: %v", ErrInvalidEvent, err)
	}
	if err := e.Validate(); err != nil {
		return RouterEvent{}, err
	}
	return e, nil
}

// EncodeMsgpack returns the msgpack encoding of e (the NATS wire format).
func EncodeMsgpack(e RouterEvent) ([]byte, error) { return msgpack.Marshal(&e) }

// DecodeMsgpack parses and validates one msgpack-encoded RouterEvent.
func DecodeMsgpack(b []byte) (RouterEvent, error) {
	if err := CheckMsgpack(b); err != nil {
		return RouterEvent{}, err
	}
	var e RouterEvent
	if err := msgpack.Unmarshal(b, &e); err != nil {
		return RouterEvent{}, fmt.Errorf("%w: msgpack: %v", ErrInvalidEvent, err)
	}
	if err := e.Validate(); err != nil {
		return RouterEvent{}, err
	}
	return e, nil
}
