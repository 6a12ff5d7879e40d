package kvevents

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

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
	if ev.salt != "" {
		// SGLang names the salt on every salted store (its metadata, or its
		// tagged map's cache_salt field).
		st.CacheSalt = ev.salt
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
