package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// vLLM and SGLang publish KV events on a ZMQ PUB socket, one message per
// batch, in three frames: a topic, an 8-byte big-endian sequence number and
// a msgpack payload. The structs are msgspec's (vllm/distributed/kv_events.py,
// sglang python/sglang/srt/disaggregation/kv_events.py):
//
//	EventBatch   [ts, events, data_parallel_rank]  msgspec array_like (SGLang,
//	             older vLLM; trailing defaults omitted, SGLang names the rank
//	             attn_dp_rank), or a map {"ts", "events", "data_parallel_rank"}
//	             (current vLLM: EventBatch without array_like)
//	BlockStored  block_hashes, parent_block_hash, token_ids, block_size,
//	             lora_id, medium, lora_name, extra_keys, group_idx,
//	             kv_cache_spec_kind, kv_cache_spec_sliding_window, …
//	BlockRemoved block_hashes, medium, group_idx, …
//	AllBlocksCleared
//
// Events are msgspec tagged structs: tagged arrays (["BlockStored", hashes,
// parent, …], array_like) or tagged maps ({"type": "BlockStored", …}).
// Hashes are ints (possibly negative: Python's hash; or above 2^63) or
// bytes (sha256 modes); bytes map through EngineHashFromBytes, negative
// ints to their two's complement. What is accepted beyond that:
//
//   - SGLang EAGLE pages, whose token_ids are bigrams ([[t0, t1], [t1, t2],
//     …]): the first token of each pair is the page's token.
//   - block_offsets (optional, one per block hash): block i's tokens are
//     token_ids[block_offsets[i] : block_offsets[i]+block_size], for sparse
//     stores whose token_ids do not list the blocks back to back.
//   - A lower-tier store (medium CPU, DISK, …) with empty token_ids: its
//     blocks are passed on by engine hash alone (vLLM's offloading
//     connector stores copies of blocks the engine already announced); the
//     index resolves them from the worker's other tiers.
//   - extra_keys (one entry per block: nil or a tuple): (identifier,
//     offset) pairs are multimodal items and go into the block's MMHashes
//     (MMHash of the identifier); byte strings (prompt-embedding hashes) too
//     (MMHash of the bytes), so such blocks never match a token request; a
//     string equal to the event's lora_name is the adapter (already in the
//     seed); in the first block of a chain (no parent) the last other
//     string is the cache_salt, as vLLM puts it there only, and the chain's
//     children inherit it (the decoder remembers the salted engine hashes);
//     other strings are multimodal identifiers of older vLLM.
//   - SGLang's cache salt, on every salted store: BlockStoredWithMetadata
//     (sgl-project/sglang#30827, SGLang 0.5.18) appends a map
//     {"cache_salt": …} after medium, where vLLM has lora_name; since
//     sgl-project/sglang#37482 events are tagged maps with a cache_salt
//     field. Either becomes the Stored's CacheSalt (other metadata keys,
//     session_id, are ignored); a salt of another type is a malformed event.
//   - Hybrid models: of the KV cache groups, only the full-attention one is
//     kept, chosen by kv_cache_spec_kind as Dynamo does; a group never
//     seen with a kind counts as full attention only if it is group 0.

// vllmDecoder is the vLLM/SGLang msgpack EngineDecoder.
type vllmDecoder struct {
	cfg EngineDecoderConfig

	r, er  bytes.Reader
	dec    *msgpack.Decoder // whole payload
	evDec  *msgpack.Decoder // one event's bytes
	cur    *msgpack.Decoder // the decoder field readers use
	groups map[int64]bool   // group_idx → is full attention, as learned
	full   int64            // the full-attention group (0 until learned)
	salts  map[uint64]string
}

// maxSalted bounds the remembered salted engine hashes; past it they are
// forgotten (children of a forgotten chain then index unsalted, which only
// costs their hits).
const maxSalted = 1 << 16

// NewVLLMDecoder returns the vLLM/SGLang msgpack EngineDecoder.
func NewVLLMDecoder(cfg EngineDecoderConfig) (EngineDecoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newVLLMDecoder(cfg), nil
}

func newVLLMDecoder(cfg EngineDecoderConfig) *vllmDecoder {
	d := &vllmDecoder{cfg: cfg}
	d.dec = msgpack.NewDecoder(&d.r)
	d.evDec = msgpack.NewDecoder(&d.er)
	return d
}

var _ EngineDecoder = (*vllmDecoder)(nil)

// Decode implements EngineDecoder for ZMQ messages (topic, sequence,
// payload).
func (d *vllmDecoder) Decode(frames [][]byte) (EngineBatch, error) {
	if len(frames) != 3 {
		return EngineBatch{}, fmt.Errorf("%w: %d frames, want 3 (topic, sequence, payload)", ErrMalformed, len(frames))
	}
	if len(frames[1]) != 8 {
		return EngineBatch{}, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrMalformed, len(frames[1]))
	}
	b, err := d.payload(frames[2])
	if err != nil {
		return EngineBatch{}, err
	}
	b.Topic = string(frames[0])
	b.Seq = binary.BigEndian.Uint64(frames[1])
	return b, nil
}

// DecodeEngineFrames decodes a vLLM/SGLang ZMQ message (topic, sequence,
// payload) for a router with the given block size, with a fresh decoder
// (no state from earlier messages).
func DecodeEngineFrames(frames [][]byte, blockSize int) (EngineBatch, error) {
	if blockSize <= 0 {
		return EngineBatch{}, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	return newVLLMDecoder(EngineDecoderConfig{BlockSize: blockSize}).Decode(frames)
}

// DecodeEnginePayload decodes the msgpack payload of one vLLM/SGLang event
// batch with a fresh decoder. A payload that is not msgpack, has trailing
// bytes or is not a batch is refused whole with ErrMalformed; a bad event
// inside a good batch is skipped and counted (EngineBatch.Skipped).
func DecodeEnginePayload(payload []byte, blockSize int) (EngineBatch, error) {
	if blockSize <= 0 {
		return EngineBatch{}, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	return newVLLMDecoder(EngineDecoderConfig{BlockSize: blockSize}).payload(payload)
}

func (d *vllmDecoder) payload(payload []byte) (EngineBatch, error) {
	if err := checkMsgpackLengths(payload); err != nil {
		return EngineBatch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	d.r.Reset(payload)
	d.dec.Reset(&d.r)
	d.cur = d.dec
	b, err := d.batch(payload)
	if err != nil {
		return EngineBatch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if d.r.Len() != 0 {
		return EngineBatch{}, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, d.r.Len())
	}
	return b, nil
}

func isArrayCode(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMapCode(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// container reports whether the next value is an array or a map, and its
// length.
func (d *vllmDecoder) container() (isMap bool, n int, err error) {
	c, err := d.cur.PeekCode()
	if err != nil {
		return false, 0, err
	}
	switch {
	case isArrayCode(c):
		n, err = d.cur.DecodeArrayLen()
		return false, n, err
	case isMapCode(c):
		n, err = d.cur.DecodeMapLen()
		return true, n, err
	}
	return false, 0, fmt.Errorf("want an array or a map, got code %#x", c)
}

func (d *vllmDecoder) isNil() bool {
	c, err := d.cur.PeekCode()
	return err == nil && c == msgpcode.Nil
}

func (d *vllmDecoder) batch(payload []byte) (EngineBatch, error) {
	var b EngineBatch
	isMap, n, err := d.container()
	if err != nil {
		return b, fmt.Errorf("batch: %w", err)
	}
	if isMap {
		// Current vLLM: EventBatch without array_like.
		hasTS, hasEvents := false, false
		for range n {
			key, err := d.cur.DecodeString()
			if err != nil {
				return b, fmt.Errorf("batch key: %w", err)
			}
			switch key {
			case "ts":
				b.TS, err = d.number()
				hasTS = true
			case "events":
				err = d.events(&b, payload)
				hasEvents = true
			case "data_parallel_rank", "attn_dp_rank":
				err = d.rank(&b)
			default:
				err = d.cur.Skip()
			}
			if err != nil {
				return b, fmt.Errorf("batch %s: %w", key, err)
			}
		}
		if !hasTS || !hasEvents {
			return b, errors.New("batch map without ts and events")
		}
		return b, nil
	}
	if n < 2 {
		return b, fmt.Errorf("batch: %d fields, want at least ts and events", n)
	}
	if b.TS, err = d.number(); err != nil {
		return b, fmt.Errorf("batch ts: %w", err)
	}
	if err := d.events(&b, payload); err != nil {
		return b, fmt.Errorf("batch events: %w", err)
	}
	if n >= 3 {
		if err := d.rank(&b); err != nil {
			return b, fmt.Errorf("batch dp rank: %w", err)
		}
	}
	for range n - 3 {
		if err := d.cur.Skip(); err != nil {
			return b, err
		}
	}
	return b, nil
}

func (d *vllmDecoder) rank(b *EngineBatch) error {
	if d.isNil() {
		return d.cur.Skip()
	}
	r, err := d.cur.DecodeInt64()
	if err == nil && (r < 0 || r > math.MaxUint32) {
		err = fmt.Errorf("out of range: %d", r)
	}
	b.DPRank = uint32(r)
	return err
}

// events decodes the events array. Each event is cut out of the payload
// first (the payload is well-formed msgpack, so Skip finds its end) and
// decoded on its own: an event that fails is skipped and counted, and the
// next one starts at the right byte.
func (d *vllmDecoder) events(b *EngineBatch, payload []byte) error {
	isMap, m, err := d.container()
	if err != nil || isMap {
		return fmt.Errorf("want an array (%v)", err)
	}
	for range m {
		start := len(payload) - d.r.Len()
		if err := d.dec.Skip(); err != nil {
			return err
		}
		end := len(payload) - d.r.Len()
		d.er.Reset(payload[start:end])
		d.evDec.Reset(&d.er)
		d.cur = d.evDec
		if err := d.event(b); err != nil {
			b.skip(SkipMalformed, 0)
		}
		d.cur = d.dec
	}
	return nil
}

func (d *vllmDecoder) number() (float64, error) {
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
func (d *vllmDecoder) scalar() (any, error) {
	c, err := d.cur.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case isArrayCode(c), isMapCode(c), msgpcode.IsExt(c), msgpcode.IsFixedExt(c):
		return nil, fmt.Errorf("want a scalar, got code %#x", c)
	case msgpcode.IsBin(c):
		return d.cur.DecodeBytes()
	}
	return d.cur.DecodeInterfaceLoose()
}

// optional decodes an optional scalar field; a container is skipped and
// reported as nil.
func (d *vllmDecoder) optional() (any, error) {
	c, err := d.cur.PeekCode()
	if err != nil {
		return nil, err
	}
	if isArrayCode(c) || isMapCode(c) || msgpcode.IsExt(c) || msgpcode.IsFixedExt(c) {
		return nil, d.cur.Skip()
	}
	return d.scalar()
}
