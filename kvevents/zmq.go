package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// vLLM and SGLang publish KV events on a ZMQ PUB socket, one message per
// batch, in three frames: a topic, an 8-byte big-endian sequence number and
// a msgpack payload (vllm/distributed/kv_events.py):
//
//	EventBatch   [ts, events, data_parallel_rank]   (msgspec array_like;
//	             trailing defaults omitted; SGLang calls the rank attn_dp_rank)
//	BlockStored  block_hashes, parent_block_hash, token_ids, block_size,
//	             lora_id, medium, lora_name, extra_keys, group_idx, …
//	BlockRemoved block_hashes, medium, group_idx, …
//	AllBlocksCleared
//
// Events are msgspec tagged structs: tagged arrays (["BlockStored", hashes,
// parent, …], array_like, older vLLM and SGLang) or tagged maps
// ({"type": "BlockStored", …}, current vLLM). Hashes are ints (possibly
// negative: Python's hash) or bytes (sha256 modes); bytes map through
// EngineHashFromBytes, negative ints to their two's complement.

// ErrMalformed reports a ZMQ message that is not a vLLM/SGLang KV event
// batch. The relay logs, counts and skips such messages.
var ErrMalformed = errors.New("malformed engine kv event message")

// EngineBatch is one decoded vLLM/SGLang event batch.
type EngineBatch struct {
	Topic string
	// Seq is the engine's message sequence number (frames only).
	Seq    uint64
	TS     float64
	DPRank uint32
	// Events are the batch's events for kvgate, in order.
	Events []Event
	// SkippedBlocks counts blocks of BlockStored events dropped because
	// their block size differs from the configured one, their medium is not
	// the GPU (an offload tier), or they belong to another KV cache group
	// than 0 (hybrid models).
	SkippedBlocks int
	// SkippedEvents counts other dropped events: unknown types and
	// BlockRemoved events of another medium or group.
	SkippedEvents int
}

// DecodeEngineFrames decodes a vLLM/SGLang ZMQ message (topic, sequence,
// payload) for a router with the given block size.
func DecodeEngineFrames(frames [][]byte, blockSize int) (EngineBatch, error) {
	if len(frames) != 3 {
		return EngineBatch{}, fmt.Errorf("%w: %d frames, want 3 (topic, sequence, payload)", ErrMalformed, len(frames))
	}
	if len(frames[1]) != 8 {
		return EngineBatch{}, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrMalformed, len(frames[1]))
	}
	b, err := DecodeEnginePayload(frames[2], blockSize)
	if err != nil {
		return EngineBatch{}, err
	}
	b.Topic = string(frames[0])
	b.Seq = binary.BigEndian.Uint64(frames[1])
	return b, nil
}

// DecodeEnginePayload decodes the msgpack payload of a vLLM/SGLang event
// batch. Unknown fields and event types are ignored; a payload that is not
// msgpack, has trailing bytes, lacks a required field or has a field of the
// wrong type is refused whole with ErrMalformed.
func DecodeEnginePayload(payload []byte, blockSize int) (EngineBatch, error) {
	if blockSize <= 0 {
		return EngineBatch{}, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	if err := checkMsgpackLengths(payload); err != nil {
		return EngineBatch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	r := bytes.NewReader(payload)
	d := &engineDecoder{dec: msgpack.NewDecoder(r), blockSize: blockSize}
	b, err := d.batch()
	if err != nil {
		return EngineBatch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if r.Len() != 0 {
		return EngineBatch{}, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, r.Len())
	}
	return b, nil
}

type engineDecoder struct {
	dec       *msgpack.Decoder
	blockSize int
}

// container reports whether the next value is an array or a map, and its
// length.
func (d *engineDecoder) container() (isMap bool, n int, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return false, 0, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err = d.dec.DecodeArrayLen()
		return false, n, err
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err = d.dec.DecodeMapLen()
		return true, n, err
	}
	return false, 0, fmt.Errorf("want an array or a map, got code %#x", c)
}

func (d *engineDecoder) isNil() bool {
	c, err := d.dec.PeekCode()
	return err == nil && c == msgpcode.Nil
}

func (d *engineDecoder) batch() (EngineBatch, error) {
	var b EngineBatch
	isMap, n, err := d.container()
	if err != nil {
		return b, fmt.Errorf("batch: %w", err)
	}
	if isMap {
		return b, errors.New("batch: want an array [ts, events, dp_rank], got a map")
	}
	if n < 2 {
		return b, fmt.Errorf("batch: %d fields, want at least ts and events", n)
	}
	if b.TS, err = d.number(); err != nil {
		return b, fmt.Errorf("batch ts: %w", err)
	}
	isMap, m, err := d.container()
	if err != nil || isMap {
		return b, fmt.Errorf("batch events: want an array (%v)", err)
	}
	for i := range m {
		if err := d.event(&b); err != nil {
			return b, fmt.Errorf("event %d: %w", i, err)
		}
	}
	if n >= 3 {
		if d.isNil() {
			err = d.dec.Skip()
		} else {
			var r int64
			r, err = d.dec.DecodeInt64()
			if err == nil && (r < 0 || r > math.MaxUint32) {
				err = fmt.Errorf("out of range: %d", r)
			}
			b.DPRank = uint32(r)
		}
		if err != nil {
			return b, fmt.Errorf("batch dp rank: %w", err)
		}
	}
	for range n - 3 {
		if err := d.dec.Skip(); err != nil {
			return b, err
		}
	}
	return b, nil
}

func (d *engineDecoder) number() (float64, error) {
	v, err := d.scalar()
	if err != nil {
		return 0, err
	}
	switch x := v.(type) {
	case float64:
		return x, nil
	case float32:
		return float64(x), nil
	case int64:
		return float64(x), nil
	case uint64:
		return float64(x), nil
	}
	return 0, fmt.Errorf("want a number, got %T", v)
}

// scalar decodes a nil, bool, number, string or bin value. Containers and
// extensions are refused before anything is read: a fuzzed length prefix
// must not make the decoder allocate or loop.
func (d *engineDecoder) scalar() (any, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedArray(c), c == msgpcode.Array16, c == msgpcode.Array32,
		msgpcode.IsFixedMap(c), c == msgpcode.Map16, c == msgpcode.Map32,
		msgpcode.IsExt(c), msgpcode.IsFixedExt(c):
		return nil, fmt.Errorf("want a scalar, got code %#x", c)
	case msgpcode.IsBin(c):
		return d.dec.DecodeBytes()
	}
	return d.dec.DecodeInterfaceLoose()
}

// optional decodes an optional scalar field; a container is skipped and
// reported as nil.
func (d *engineDecoder) optional() (any, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32 ||
		msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 ||
		msgpcode.IsExt(c) || msgpcode.IsFixedExt(c) {
		return nil, d.dec.Skip()
	}
	return d.scalar()
}

// rawEvent holds an event's fields whatever its encoding.
type rawEvent struct {
	tag              string
	hashes           []uint64
	hasHashes        bool
	parent           *uint64
	tokens           []uint32
	hasTokens        bool
	blockSize        int64
	hasBlockSize     bool
	medium, loraName string
	loraID           *int64
	group            int64
}

// Field positions of the array (array_like) encodings, after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func (d *engineDecoder) event(b *EngineBatch) error {
	isMap, n, err := d.container()
	if err != nil {
		return err
	}
	var ev rawEvent
	if isMap {
		// The tag may come after other keys: read them all first.
		for range n {
			key, err := d.dec.DecodeString()
			if err != nil {
				return fmt.Errorf("key: %w", err)
			}
			if key == "type" {
				if ev.tag, err = d.dec.DecodeString(); err != nil {
					return fmt.Errorf("type: %w", err)
				}
				continue
			}
			if err := d.field(&ev, key); err != nil {
				return err
			}
		}
		if ev.tag == "" {
			return errors.New("tagged map without a type")
		}
	} else {
		if n == 0 {
			return errors.New("empty tagged array")
		}
		if ev.tag, err = d.dec.DecodeString(); err != nil {
			return fmt.Errorf("tag: %w", err)
		}
		var names []string
		switch ev.tag {
		case "BlockStored":
			names = storedFields
		case "BlockRemoved":
			names = removedFields
		}
		for i := 1; i < n; i++ {
			name := ""
			if i-1 < len(names) {
				name = names[i-1]
			}
			if err := d.field(&ev, name); err != nil {
				return err
			}
		}
	}
	return d.apply(b, &ev)
}

// field decodes the value of a named field into ev. Required fields
// (hashes, parent, tokens, block size) must have their type; optional ones
// of an unexpected type are ignored, since newer engines and SGLang's
// metadata variants append fields the positions above do not know.
func (d *engineDecoder) field(ev *rawEvent, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.hashes, err = d.hashes()
		ev.hasHashes = true
	case "parent_block_hash":
		if d.isNil() {
			return d.dec.Skip()
		}
		var h uint64
		h, err = d.hash()
		ev.parent = &h
	case "token_ids":
		ev.tokens, err = d.tokens()
		ev.hasTokens = true
	case "block_size":
		ev.blockSize, err = d.dec.DecodeInt64()
		ev.hasBlockSize = true
	case "lora_id", "group_idx":
		v, derr := d.optional()
		if derr != nil {
			return fmt.Errorf("%s: %w", name, derr)
		}
		var x int64
		switch t := v.(type) {
		case int64:
			x = t
		case uint64:
			x = int64(min(t, math.MaxInt64))
		default:
			return nil
		}
		if name == "lora_id" {
			ev.loraID = &x
		} else {
			ev.group = x
		}
	case "medium", "lora_name":
		v, derr := d.optional()
		if derr != nil {
			return fmt.Errorf("%s: %w", name, derr)
		}
		s, _ := v.(string)
		if name == "medium" {
			ev.medium = s
		} else {
			ev.loraName = s
		}
	default:
		err = d.dec.Skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func (d *engineDecoder) hash() (uint64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Uint64:
		return d.dec.DecodeUint64()
	case msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64):
		v, err := d.dec.DecodeInt64()
		return uint64(v), err
	}
	v, err := d.scalar()
	if err != nil {
		return 0, err
	}
	switch h := v.(type) {
	case int64:
		return uint64(h), nil
	case uint64:
		return h, nil
	case []byte:
		return EngineHashFromBytes(h), nil
	}
	return 0, fmt.Errorf("block hash: want int or bin, got %T", v)
}

func (d *engineDecoder) hashes() ([]uint64, error) {
	isMap, n, err := d.container()
	if err != nil || isMap {
		return nil, fmt.Errorf("want an array (%v)", err)
	}
	out := make([]uint64, 0, min(n, 4096))
	for range n {
		h, err := d.hash()
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

func (d *engineDecoder) tokens() ([]uint32, error) {
	isMap, n, err := d.container()
	if err != nil || isMap {
		return nil, fmt.Errorf("want an array (%v)", err)
	}
	out := make([]uint32, 0, min(n, 1<<16))
	for range n {
		t, err := d.dec.DecodeInt64()
		if err != nil {
			return nil, err
		}
		if t < 0 || t > math.MaxUint32 {
			return nil, fmt.Errorf("token id %d out of range", t)
		}
		out = append(out, uint32(t))
	}
	return out, nil
}

func (d *engineDecoder) apply(b *EngineBatch, ev *rawEvent) error {
	gpu := ev.medium == "" || strings.EqualFold(ev.medium, "GPU")
	switch ev.tag {
	case "BlockStored":
		if !ev.hasHashes || !ev.hasTokens || !ev.hasBlockSize {
			return errors.New("BlockStored needs block_hashes, token_ids and block_size")
		}
		if ev.blockSize <= 0 || int64(len(ev.tokens)) != int64(len(ev.hashes))*ev.blockSize {
			return fmt.Errorf("BlockStored: %d token ids for %d blocks of %d", len(ev.tokens), len(ev.hashes), ev.blockSize)
		}
		if len(ev.hashes) == 0 {
			return nil
		}
		if ev.blockSize != int64(d.blockSize) || !gpu || ev.group != 0 {
			b.SkippedBlocks += len(ev.hashes)
			return nil
		}
		st := &Stored{ParentHash: ev.parent, LoRAName: ev.loraName, Blocks: make([]Block, len(ev.hashes))}
		if st.LoRAName == "" && ev.loraID != nil && *ev.loraID != 0 {
			// An adapter known only by its engine-local id: keep its blocks
			// apart from the base model's (requests cannot name it, so they
			// will simply not match).
			st.LoRAName = fmt.Sprintf("lora-id:%d", *ev.loraID)
		}
		bs := d.blockSize
		for i, h := range ev.hashes {
			st.Blocks[i] = Block{EngineHash: h, TokenIDs: ev.tokens[i*bs : (i+1)*bs : (i+1)*bs]}
		}
		b.Events = append(b.Events, Event{Stored: st})
	case "BlockRemoved":
		if !ev.hasHashes {
			return errors.New("BlockRemoved needs block_hashes")
		}
		if !gpu || ev.group != 0 {
			b.SkippedEvents++
			return nil
		}
		if len(ev.hashes) > 0 {
			b.Events = append(b.Events, Event{Removed: &Removed{EngineHashes: ev.hashes}})
		}
	case "AllBlocksCleared":
		b.Events = append(b.Events, Event{Cleared: true})
	default:
		b.SkippedEvents++
	}
	return nil
}
