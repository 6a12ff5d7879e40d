package kvevents

import (
	"errors"
	"fmt"
)

// EngineDecoder turns the messages of one engine's KV event stream into
// kvgate events. It is the seam between an engine's wire format and the
// relay (kvevents/relay takes one); NewVLLMDecoder is the vLLM/SGLang
// msgpack implementation.
//
// Contract:
//   - Decode is not safe for concurrent use. A decoder may keep state
//     across messages of its stream (which KV cache group is the
//     full-attention one, the cache salt of stored chains), so one decoder
//     serves one engine, all its data-parallel ranks, in arrival order.
//   - It never panics on any input and allocates no more than a small
//     multiple of the message's size, whatever counts the message claims.
//   - An error (wrapping ErrMalformed) means the message as a whole was
//     unusable: wrong framing, not the format at all, truncated. Then no
//     event of it is to be applied. A message whose batch is readable but
//     some of whose events are not returns no error: the good events are in
//     the batch, the others are counted in EngineBatch.Skipped by reason.
//   - It never modifies frames; the batch does not alias them.
type EngineDecoder interface {
	Decode(frames [][]byte) (EngineBatch, error)
}

// EngineDecoderConfig configures a decoder for one pool's router.
type EngineDecoderConfig struct {
	// BlockSize is the pool's block size: stored blocks of another size
	// are skipped (SkipBlockSize).
	BlockSize int
	// LoRANames maps an engine's adapter ids to adapter names, for engines
	// that report only the id: vLLM versions sending an integer lora_id
	// without lora_name (key: the id in decimal, e.g. "3"), SGLang, whose
	// lora_id is the adapter's string id. A request names the adapter, so
	// an id the table lacks becomes "lora-id:<id>", which keeps its blocks
	// apart from the base model's but matches no request. lora_id 0 is the
	// base model.
	LoRANames map[string]string
}

// Validate checks the configuration.
func (c EngineDecoderConfig) Validate() error {
	if c.BlockSize <= 0 {
		return fmt.Errorf("%w: got %d", ErrBlockSize, c.BlockSize)
	}
	return nil
}

// SkipReason says why an engine event (or its blocks) was not passed on.
type SkipReason string

// The reasons an event is skipped. Each is a value of the relay's
// kvgate_relay_skipped_events_total{reason} counter.
const (
	// SkipBlockSize: a stored event's block size is not the pool's (an
	// engine configured with another block or page size; SGLang's default
	// page_size 1).
	SkipBlockSize SkipReason = "block_size"
	// SkipKVGroup: the event belongs to a KV cache group other than the
	// full-attention one (hybrid models: sliding window, mamba).
	SkipKVGroup SkipReason = "kv_group"
	// SkipMedium: the event's medium is not one TierOf knows.
	SkipMedium SkipReason = "medium"
	// SkipUnknownType: an event type kvgate does not use.
	SkipUnknownType SkipReason = "unknown_type"
	// SkipMalformed: the event lacks a required field, has one of the wrong
	// type, or its token ids do not fill its blocks.
	SkipMalformed SkipReason = "malformed"
)

// ErrMalformed reports an engine message that is not a KV event batch of
// the decoder's format. The relay logs, counts and skips such messages.
var ErrMalformed = errors.New("malformed engine kv event message")

// EngineBatch is one decoded engine event batch.
type EngineBatch struct {
	Topic string
	// Seq is the engine's message sequence number (frames only).
	Seq    uint64
	TS     float64
	DPRank uint32
	// Events are the batch's events for kvgate, in order.
	Events []Event
	// Skipped counts the events not passed on, by reason (nil when none).
	Skipped map[SkipReason]int
	// SkippedBlocks counts the blocks of the stored events skipped.
	SkippedBlocks int
	// EngineBlockSize is the block size of the last stored event skipped
	// for SkipBlockSize (0 if none): what the engine is configured with.
	EngineBlockSize int
}

// SkippedEvents is the number of events skipped for any reason.
func (b *EngineBatch) SkippedEvents() int {
	n := 0
	for _, c := range b.Skipped {
		n += c
	}
	return n
}

func (b *EngineBatch) skip(r SkipReason, blocks int) {
	if b.Skipped == nil {
		b.Skipped = make(map[SkipReason]int, 2)
	}
	b.Skipped[r]++
	b.SkippedBlocks += blocks
}
