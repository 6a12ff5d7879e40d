package kvevents

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

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
	salt             string // SGLang's cache_salt (metadata or field)
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
	case "metadata":
		return d.metadata(ev)
	case "cache_salt":
		// SGLang's tagged-map BlockStored (sgl-project/sglang#37482).
		if d.isNil() {
			return d.cur.Skip()
		}
		if ev.salt, err = d.cur.DecodeString(); err != nil {
			return fmt.Errorf("cache_salt: want a string: %w", err)
		}
		return nil
	case "lora_name":
		// Position 7 of an array BlockStored is vLLM's lora_name, or
		// SGLang's BlockStoredWithMetadata map.
		if c, perr := d.cur.PeekCode(); perr == nil && isMapCode(c) {
			return d.metadata(ev)
		}
		fallthrough
	case "medium", "kv_cache_spec_kind":
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

// metadata decodes SGLang's BlockStoredMetadata, a msgspec map
// {"cache_salt": str, "session_id": str} (fields omitted when unset; see
// the fields of BlockStoredWithMetadata in python/sglang/srt/
// disaggregation/kv_events.py, sgl-project/sglang#30827 and #37482).
// Keys other than cache_salt are skipped.
func (d *vllmDecoder) metadata(ev *rawEvent) error {
	if d.isNil() {
		return d.cur.Skip()
	}
	isMap, n, err := d.container()
	if err != nil || !isMap {
		return fmt.Errorf("metadata: want a map (%v)", err)
	}
	for range n {
		key, err := d.cur.DecodeString()
		if err != nil {
			return fmt.Errorf("metadata key: %w", err)
		}
		if key != "cache_salt" || d.isNil() {
			if err := d.cur.Skip(); err != nil {
				return fmt.Errorf("metadata.%s: %w", key, err)
			}
			continue
		}
		if ev.salt, err = d.cur.DecodeString(); err != nil {
			return fmt.Errorf("metadata.cache_salt: want a string: %w", err)
		}
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
