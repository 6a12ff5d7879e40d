package kvevents

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Block is one KV block an engine stored: its opaque engine hash and the
// token ids it holds (exactly one block's worth). A block may carry its
// kvgate LocalHash instead of token ids (index dumps do, since the index
// keeps hashes, not tokens); token ids win when both are present.
type Block struct {
	EngineHash uint64   `json:"engine_hash" msgpack:"engine_hash"`
	TokenIDs   []uint32 `json:"token_ids,omitempty" msgpack:"token_ids,omitempty"`
	LocalHash  *uint64  `json:"local_hash,omitempty" msgpack:"local_hash,omitempty"`
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
}

// Removed reports blocks the engine evicted, by engine hash.
type Removed struct {
	EngineHashes []uint64 `json:"engine_hashes" msgpack:"engine_hashes"`
}

// Event is exactly one of Stored, Removed or Cleared (all blocks dropped).
type Event struct {
	Stored  *Stored  `json:"stored,omitempty" msgpack:"stored,omitempty"`
	Removed *Removed `json:"removed,omitempty" msgpack:"removed,omitempty"`
	Cleared bool     `json:"cleared,omitempty" msgpack:"cleared,omitempty"`
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

// Kind names the event's variant: "stored", "removed", "cleared", or "" if
// the event is not exactly one of them.
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
		return fmt.Errorf("%w: event %d of worker %q must be exactly one of stored, removed, cleared", ErrInvalidEvent, e.EventID, e.WorkerID)
	case "stored":
		if len(e.Event.Stored.Blocks) == 0 {
			return fmt.Errorf("%w: stored event %d of worker %q has no blocks", ErrInvalidEvent, e.EventID, e.WorkerID)
		}
		for i, b := range e.Event.Stored.Blocks {
			if len(b.TokenIDs) == 0 && b.LocalHash == nil {
				return fmt.Errorf("%w: stored event %d of worker %q: block %d has neither token ids nor a local hash", ErrInvalidEvent, e.EventID, e.WorkerID, i)
			}
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
