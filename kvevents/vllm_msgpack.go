package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

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

// extraKey is what a block's extra_keys entry holds for kvgate.
type extraKey struct {
	mm      []uint64
	strs    []string
	present bool
}

// rawEvent holds an event's fields whatever its encoding.
type rawEvent struct {
	tag              string
	hashes           []uint64
	hasHashes        bool
	parent           *uint64
	tokens           []uint32
	hasTokens        bool
	offsets          []int64
	hasOffsets       bool
	blockSize        int64
	hasBlockSize     bool
	medium, loraName string
	loraID           string // "" for none or 0; decimal for ints
	group            int64
	hasGroup         bool
	kind             string
	extra            []extraKey
}

// Field positions of the array (array_like) encodings, after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func (d *vllmDecoder) event(b *EngineBatch) error {
	isMap, n, err := d.container()
	if err != nil {
		return err
	}
	var ev rawEvent
	if isMap {
		// The tag may come after other keys: read them all first.
		for range n {
			key, err := d.cur.DecodeString()
			if err != nil {
				return fmt.Errorf("key: %w", err)
			}
			if key == "type" {
				if ev.tag, err = d.cur.DecodeString(); err != nil {
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
		if ev.tag, err = d.cur.DecodeString(); err != nil {
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
func (d *vllmDecoder) field(ev *rawEvent, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.hashes, err = d.hashes()
		ev.hasHashes = true
	case "parent_block_hash":
		if d.isNil() {
			return d.cur.Skip()
		}
		var h uint64
		h, err = d.hash()
		ev.parent = &h
	case "token_ids":
		ev.tokens, err = d.tokens()
		ev.hasTokens = true
	case "block_offsets":
		if d.isNil() {
			return d.cur.Skip()
		}
		ev.offsets, err = d.ints()
		ev.hasOffsets = true
	case "block_size":
		ev.blockSize, err = d.cur.DecodeInt64()
		ev.hasBlockSize = true
	case "extra_keys":
		ev.extra, err = d.extraKeys()
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
		case string: // SGLang's adapter ids are strings
			if name == "lora_id" {
				ev.loraID = t
			}
			return nil
		default:
			return nil
		}
		if name == "lora_id" {
			if x != 0 {
				ev.loraID = strconv.FormatInt(x, 10)
			}
		} else {
			ev.group, ev.hasGroup = x, true
		}
	case "medium", "lora_name", "kv_cache_spec_kind":
		v, derr := d.optional()
		if derr != nil {
			return fmt.Errorf("%s: %w", name, derr)
		}
		s, _ := v.(string)
		switch name {
		case "medium":
			ev.medium = s
		case "lora_name":
			ev.loraName = s
		default:
			ev.kind = s
		}
	default:
		err = d.cur.Skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func (d *vllmDecoder) hash() (uint64, error) {
	c, err := d.cur.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Uint64:
		return d.cur.DecodeUint64()
	case msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64):
		v, err := d.cur.DecodeInt64()
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

func (d *vllmDecoder) hashes() ([]uint64, error) {
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

func (d *vllmDecoder) ints() ([]int64, error) {
	isMap, n, err := d.container()
	if err != nil || isMap {
		return nil, fmt.Errorf("want an array (%v)", err)
	}
	out := make([]int64, 0, min(n, 4096))
	for range n {
		v, err := d.cur.DecodeInt64()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// tokens decodes token_ids: ints, or SGLang EAGLE bigrams [t_i, t_i+1], of
// which the first is the token.
func (d *vllmDecoder) tokens() ([]uint32, error) {
	isMap, n, err := d.container()
	if err != nil || isMap {
		return nil, fmt.Errorf("want an array (%v)", err)
	}
	out := make([]uint32, 0, min(n, 1<<16))
	for range n {
		c, err := d.cur.PeekCode()
		if err != nil {
			return nil, err
		}
		var t int64
		if isArrayCode(c) {
			k, err := d.cur.DecodeArrayLen()
			if err != nil {
				return nil, err
			}
			if k < 1 {
				return nil, errors.New("empty token pair")
			}
			if t, err = d.cur.DecodeInt64(); err != nil {
				return nil, err
			}
			for range k - 1 {
				if err := d.cur.Skip(); err != nil {
					return nil, err
				}
			}
		} else if t, err = d.cur.DecodeInt64(); err != nil {
			return nil, err
		}
		if t < 0 || t > math.MaxUint32 {
			return nil, fmt.Errorf("token id %d out of range", t)
		}
		out = append(out, uint32(t))
	}
	return out, nil
}

// extraKeys decodes extra_keys: per block nil or a tuple of items.
func (d *vllmDecoder) extraKeys() ([]extraKey, error) {
	if d.isNil() {
		return nil, d.cur.Skip()
	}
	isMap, n, err := d.container()
	if err != nil || isMap {
		return nil, fmt.Errorf("want an array (%v)", err)
	}
	out := make([]extraKey, n)
	for i := range out {
		if d.isNil() {
			if err := d.cur.Skip(); err != nil {
				return nil, err
			}
			continue
		}
		isMap, k, err := d.container()
		if err != nil || isMap {
			return nil, fmt.Errorf("block %d: want a tuple (%v)", i, err)
		}
		out[i].present = true
		for range k {
			if err := d.extraItem(&out[i]); err != nil {
				return nil, fmt.Errorf("block %d: %w", i, err)
			}
		}
	}
	return out, nil
}

func (d *vllmDecoder) extraItem(x *extraKey) error {
	c, err := d.cur.PeekCode()
	if err != nil {
		return err
	}
	if isArrayCode(c) {
		// (identifier, offset, …): a multimodal item.
		k, err := d.cur.DecodeArrayLen()
		if err != nil {
			return err
		}
		if k > 0 {
			v, err := d.optional()
			if err != nil {
				return err
			}
			switch id := v.(type) {
			case string:
				x.mm = append(x.mm, MMHash(id))
			case []byte:
				x.mm = append(x.mm, MMHash(string(id)))
			}
			k--
		}
		for range k {
			if err := d.cur.Skip(); err != nil {
				return err
			}
		}
		return nil
	}
	v, err := d.optional()
	if err != nil {
		return err
	}
	switch s := v.(type) {
	case string:
		x.strs = append(x.strs, s)
	case []byte: // a prompt-embedding hash
		x.mm = append(x.mm, MMHash(string(s)))
	}
	return nil
}

// fullAttention reports whether a kv_cache_spec_kind names full attention
// (vLLM: "full_attention", FullAttentionSpec, MLAAttentionSpec; not
// sliding_window, chunked_local, mamba).
func fullAttention(kind string) bool {
	k := strings.ToLower(kind)
	return strings.Contains(k, "full") || strings.Contains(k, "mla")
}

// keepGroup decides whether an event of group (and kind, when the event
// says) belongs to the full-attention group, learning kinds as they come.
func (d *vllmDecoder) keepGroup(ev *rawEvent) bool {
	if !ev.hasGroup {
		return true
	}
	if ev.kind != "" {
		full := fullAttention(ev.kind)
		if d.groups == nil {
			d.groups = make(map[int64]bool, 2)
		}
		if len(d.groups) < 64 {
			d.groups[ev.group] = full
		}
		if full {
			d.full = ev.group
		}
		return full
	}
	if full, ok := d.groups[ev.group]; ok {
		return full
	}
	return ev.group == d.full
}

func (d *vllmDecoder) apply(b *EngineBatch, ev *rawEvent) error {
	switch ev.tag {
	case "BlockStored":
		return d.applyStored(b, ev)
	case "BlockRemoved":
		if !ev.hasHashes {
			return errors.New("BlockRemoved needs block_hashes")
		}
		tier, ok := TierOf(ev.medium)
		switch {
		case !ok:
			b.skip(SkipMedium, 0)
			return nil
		case !d.keepGroup(ev):
			b.skip(SkipKVGroup, 0)
			return nil
		}
		for _, h := range ev.hashes {
			delete(d.salts, h)
		}
		if len(ev.hashes) > 0 {
			rm := &Removed{EngineHashes: ev.hashes}
			if tier != TierGPU {
				rm.Medium = tier.String()
			}
			b.Events = append(b.Events, Event{Removed: rm})
		}
	case "AllBlocksCleared":
		clear(d.salts)
		b.Events = append(b.Events, Event{Cleared: true})
	default:
		b.skip(SkipUnknownType, 0)
	}
	return nil
}

func (d *vllmDecoder) applyStored(b *EngineBatch, ev *rawEvent) error {
	if !ev.hasHashes || !ev.hasBlockSize {
		return errors.New("BlockStored needs block_hashes and block_size")
	}
	nb := len(ev.hashes)
	// Filters first: a store this router does not keep is skipped for that
	// reason, whatever its tokens.
	tier, ok := TierOf(ev.medium)
	switch {
	case !ok:
		b.skip(SkipMedium, nb)
		return nil
	case !d.keepGroup(ev):
		b.skip(SkipKVGroup, nb)
		return nil
	case ev.blockSize != int64(d.cfg.BlockSize):
		b.skip(SkipBlockSize, nb)
		if ev.blockSize > 0 && ev.blockSize <= math.MaxInt32 {
			b.EngineBlockSize = int(ev.blockSize)
		}
		return nil
	}
	if nb == 0 {
		return nil
	}
	bs := d.cfg.BlockSize
	byRef := tier != TierGPU && len(ev.tokens) == 0
	switch {
	case byRef:
	case !ev.hasTokens:
		return errors.New("BlockStored needs token_ids")
	case ev.hasOffsets:
		if len(ev.offsets) != nb {
			return fmt.Errorf("BlockStored: %d block offsets for %d blocks", len(ev.offsets), nb)
		}
		for _, o := range ev.offsets {
			if o < 0 || o > int64(len(ev.tokens)-bs) {
				return fmt.Errorf("BlockStored: block offset %d out of %d token ids", o, len(ev.tokens))
			}
		}
	case len(ev.tokens) != nb*bs:
		return fmt.Errorf("BlockStored: %d token ids for %d blocks of %d", len(ev.tokens), nb, bs)
	}
	if ev.extra != nil && len(ev.extra) != nb {
		return fmt.Errorf("BlockStored: %d extra_keys for %d blocks", len(ev.extra), nb)
	}
	st := &Stored{ParentHash: ev.parent, LoRAName: ev.loraName, Blocks: make([]Block, nb)}
	if tier != TierGPU {
		st.Medium = tier.String()
	}
	if st.LoRAName == "" && ev.loraID != "" {
		if name, ok := d.cfg.LoRANames[ev.loraID]; ok {
			st.LoRAName = name
		} else {
			// An adapter known only by its engine-local id: keep its blocks
			// apart from the base model's (requests cannot name it, so they
			// will simply not match).
			st.LoRAName = "lora-id:" + ev.loraID
		}
	}
	if ev.parent != nil {
		st.CacheSalt = d.salts[*ev.parent]
	}
	for i, h := range ev.hashes {
		blk := Block{EngineHash: h}
		if !byRef {
			off := i * bs
			if ev.hasOffsets {
				off = int(ev.offsets[i])
			}
			blk.TokenIDs = ev.tokens[off : off+bs : off+bs]
		}
		if ev.extra != nil && ev.extra[i].present {
			x := ev.extra[i]
			salt := ""
			for _, s := range x.strs {
				switch {
				case s == ev.loraName || (s == st.LoRAName && s != ""):
				case i == 0 && ev.parent == nil:
					if salt != "" {
						blk.MMHashes = append(blk.MMHashes, MMHash(salt))
					}
					salt = s
				default:
					blk.MMHashes = append(blk.MMHashes, MMHash(s))
				}
			}
			if salt != "" {
				st.CacheSalt = salt
			}
			blk.MMHashes = append(blk.MMHashes, x.mm...)
			slices.Sort(blk.MMHashes)
		}
		st.Blocks[i] = blk
	}
	if st.CacheSalt != "" {
		if d.salts == nil || len(d.salts) >= maxSalted {
			d.salts = make(map[uint64]string)
		}
		for _, blk := range st.Blocks {
			d.salts[blk.EngineHash] = st.CacheSalt
		}
	}
	b.Events = append(b.Events, Event{Stored: st})
	return nil
}
