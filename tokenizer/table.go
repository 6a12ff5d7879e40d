package tokenizer

import (
	"math/bits"

	"github.com/zeebo/xxh3"
)

// The two lookups of every encode, token bytes → id and token pair →
// merge, run on these open-addressing tables rather than on Go maps. A map
// of 100k strings is 100k pointers for the GC to mark on every cycle, and a
// lookup in it walks the control word, the slot and then the key's bytes
// somewhere else on the heap. These tables hold no pointers, and a slot
// carries enough of its key's hash to reject most misses without leaving
// the slot. Both are built once at load and only read after that, so they
// are safe for concurrent use.

// tableSize is the power of two of slots for n keys: at most half full,
// which keeps linear probe runs short.
func tableSize(n int) int {
	return 1 << bits.Len(uint(2*n))
}

// vocabTable maps token bytes to token ids.
type vocabTable struct {
	arena []byte      // the bytes of every token, end to end
	slots []vocabSlot // len is a power of two
	mask  uint64
	// emptyID, hasEmpty: the empty string, which the slots cannot hold
	// (a slot is free when its length is 0).
	emptyID  uint32
	hasEmpty bool
}

type vocabSlot struct {
	tag uint32 // the high half of the key's hash
	n   uint32 // key length; 0: free
	off uint32 // key bytes: arena[off : off+n]
	id  uint32
}

func newVocabTable(vocab map[string]uint32) *vocabTable {
	size := 0
	for tok := range vocab {
		size += len(tok)
	}
	t := &vocabTable{arena: make([]byte, 0, size), slots: make([]vocabSlot, tableSize(len(vocab)))}
	t.mask = uint64(len(t.slots) - 1)
	for tok, id := range vocab {
		if tok == "" {
			t.emptyID, t.hasEmpty = id, true
			continue
		}
		h := xxh3.HashString(tok)
		i := h & t.mask
		for t.slots[i].n != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = vocabSlot{tag: uint32(h >> 32), n: uint32(len(tok)), off: uint32(len(t.arena)), id: id}
		t.arena = append(t.arena, tok...)
	}
	return t
}

// get is vocab[s].
func (t *vocabTable) get(s string) (uint32, bool) {
	if s == "" {
		return t.emptyID, t.hasEmpty
	}
	h := xxh3.HashString(s)
	tag := uint32(h >> 32)
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		sl := &t.slots[i]
		if sl.n == 0 {
			return 0, false
		}
		if sl.tag == tag && int(sl.n) == len(s) && string(t.arena[sl.off:sl.off+sl.n]) == s {
			return sl.id, true
		}
	}
}

// pairTable maps a pair key (pairKey) to its merge, rank<<32 | merged id.
type pairTable struct {
	slots []pairSlot // len is a power of two
	shift uint       // 64 - log2(len(slots)): the hash's top bits index
}

type pairSlot struct{ key, val uint64 }

// freePair marks a free slot. It is not a pair of ids that occur (ids are
// below 1<<26), and a free slot's val is a miss, so that looking it up
// finds "no merge" as for any other absent pair.
var freePair = pairSlot{key: ^uint64(0), val: uint64(noRank) << 32}

func newPairTable(merges map[uint64]uint64) *pairTable {
	size := tableSize(len(merges))
	t := &pairTable{slots: make([]pairSlot, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
	for i := range t.slots {
		t.slots[i] = freePair
	}
	mask := uint64(size - 1)
	for k, v := range merges {
		if k == freePair.key {
			panic("tokenizer: pair key collides with the free-slot marker")
		}
		i := t.index(k)
		for t.slots[i].key != freePair.key {
			i = (i + 1) & mask
		}
		t.slots[i] = pairSlot{key: k, val: v}
	}
	return t
}

// index is the home slot of k: Fibonacci hashing, the top bits of k times
// 2^64/φ, which spreads the structured keys (two small ids) evenly.
func (t *pairTable) index(k uint64) uint64 {
	return (k * 0x9E3779B97F4A7C15) >> t.shift
}

// get returns the merge of key, or rank noRank if there is none.
func (t *pairTable) get(key uint64) uint64 {
	mask := uint64(len(t.slots) - 1)
	for i := t.index(key); ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.key == key || sl.key == freePair.key {
			return sl.val
		}
	}
}
