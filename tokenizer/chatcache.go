package tokenizer

import (
	"encoding/binary"
	"hash/maphash"
	"strings"
	"sync"
)

// segmenter is implemented by the local backends. A rendered chat is cut
// into segments whose encodings are independent of each other: at added
// tokens (which the engine splits at too) and, where the pre-tokenizer
// always separates them, at "\n<" (a line that starts a chat-template
// marker). The ids of the text are then the concatenation of the ids of
// its segments, which is what lets chatCache reuse them.
type segmenter interface {
	segments(text string, emit func(segment))
	appendSegment(ids []uint32, s segment) []uint32
}

// splitNewlineMarker cuts a text segment before each '<' that follows a
// newline, keeping the start offsets.
func splitNewlineMarker(s segment, emit func(segment)) {
	text := s.text
	off := 0
	for {
		i := strings.Index(text[off:], "\n<")
		if i < 0 {
			break
		}
		cut := off + i + 1
		emit(segment{text: text[:cut], start: s.start})
		s.start += cut
		text = text[cut:]
		off = 0
	}
	emit(segment{text: text, start: s.start})
}

// chatCache keeps the ids of rendered chats in chunks, keyed by the hash
// of the rendered text up to the chunk's end (chained chunk by chunk), so
// that turn n+1 of a conversation re-encodes only what turn n did not
// have. A chunk is a run of whole segments of at least chunkBytes, cut
// greedily from the start of the text, so two texts with a common prefix
// cut it into the same chunks; only the last, shorter chunk of a text is
// re-encoded when the next turn extends it. The chunk's text is kept with
// its ids and compared on a hit, so a hash collision costs a re-encode,
// never wrong ids. Safe for concurrent use.
//
// The cache is bounded twice: by entries (Config.CacheSize) and by the
// bytes it holds (chatCacheBytes, counted as the capacity of its arena
// blocks), so a few huge prompts cannot hold gigabytes.
//
// Its storage holds no pointers, so the garbage collector never walks it
// (a Go LRU of strings and slices is hundreds of thousands of objects the
// GC marks at every cycle, and a kept substring pins the whole rendered
// chat it was cut from): each chunk's ids (4 bytes each, little-endian)
// and text are copied into arena blocks, plain byte slices filled in order
// and evicted oldest first, and an open-addressing table of fixed-size
// slots maps a chunk's key to its place. A hit in the older half of the
// blocks is copied to the newest one, so a hot chunk (a system prompt every
// request shares) outlives the cold ones written around it, as in an LRU.
type chatCache struct {
	seed       maphash.Seed
	maxEntries int
	budget     int64 // chatCacheBytes but in tests

	mu     sync.Mutex
	blocks []ccBlock // oldest first; blocks[i] has sequence number first+i
	first  uint32
	arena  int64    // bytes of the blocks' capacity, <= budget
	held   int64    // bytes of the live chunks
	slots  []ccSlot // len a power of two (or 0 before the first add)
	live   int      // slots naming a live chunk, <= maxEntries
	filled int      // slots not empty: live, dead or naming an evicted block
}

// ccBlock is one arena block of the chat cache.
type ccBlock struct {
	buf   []byte
	live  int   // live chunks in it
	bytes int64 // their bytes
}

// ccSlot names a chunk: its key, and where its bytes are (ids first, then
// text). A slot whose block was evicted, or a dead one (its chunk was
// copied to a newer block), is a tombstone: lookups probe past it and
// adds reuse it; rehash drops it.
type ccSlot struct {
	key   uint64
	block uint32 // the block's sequence number plus one; 0: empty, ccDead: dead
	off   uint32
	ids   uint32 // number of ids
	text  uint32 // bytes of text
}

const ccDead = ^uint32(0)

func (s ccSlot) size() int64 { return 4*int64(s.ids) + int64(s.text) }

// chatCacheBytes bounds the bytes one model's chat cache holds.
const chatCacheBytes = 64 << 20

// ccBlockBytes is the arena's block size (smaller when the budget is: a
// sixteenth of it). Eviction drops a whole block, a few percent of the
// entries at the default sizes; a chunk bigger than a block gets a block
// of its own.
const ccBlockBytes = 64 << 10

// chunkBytes trades per-lookup overhead against the re-encoded tail.
const chunkBytes = 256

func newChatCache(size int) *chatCache {
	if size <= 0 {
		return nil // no cache
	}
	return &chatCache{seed: maphash.MakeSeed(), maxEntries: size, budget: chatCacheBytes}
}

// isLive reports whether slot s names a chunk still in the arena.
func (c *chatCache) isLive(s *ccSlot) bool {
	return s.block != 0 && s.block != ccDead && s.block-1 >= c.first
}

// bytesOf returns the bytes of the live chunk slot s names.
func (c *chatCache) bytesOf(s *ccSlot) []byte {
	b := c.blocks[s.block-1-c.first].buf
	return b[s.off : int64(s.off)+s.size()]
}

func ccHome(key uint64, mask int) int { return int((key * 0x9E3779B97F4A7C15) >> 32 & uint64(mask)) }

// find returns the index of the live slot of key, or -1.
func (c *chatCache) find(key uint64) int {
	if len(c.slots) == 0 {
		return -1
	}
	mask := len(c.slots) - 1
	for i := ccHome(key, mask); ; i = (i + 1) & mask {
		s := &c.slots[i]
		switch {
		case s.block == 0:
			return -1
		case s.key == key && c.isLive(s):
			return i
		}
	}
}

// lookup appends the ids of the chunk of key to ids if the cache holds it
// with the same text.
func (c *chatCache) lookup(key uint64, chunk string, ids []uint32) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.find(key)
	if i < 0 {
		return ids, false
	}
	s := c.slots[i]
	b := c.bytesOf(&s)
	if string(b[4*s.ids:]) != chunk {
		return ids, false // a hash collision
	}
	for k := range int(s.ids) {
		ids = append(ids, binary.LittleEndian.Uint32(b[4*k:]))
	}
	if n := uint32(len(c.blocks)); n > 1 && s.block-1-c.first < n/2 {
		// In the older half: copy it to the newest block.
		c.kill(i)
		c.put(key, ids[len(ids)-int(s.ids):], chunk)
	}
	return ids, true
}

// add caches the ids of a chunk unless another request did meanwhile.
func (c *chatCache) add(key uint64, ids []uint32, chunk string) {
	if size := 4*int64(len(ids)) + int64(len(chunk)); size == 0 || size > c.budget/16 {
		return // empty, or too big to be worth its room
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.find(key) >= 0 {
		return
	}
	c.put(key, ids, chunk)
}

// kill makes slot i dead: its chunk is no longer held.
func (c *chatCache) kill(i int) {
	s := &c.slots[i]
	b := &c.blocks[s.block-1-c.first]
	b.live--
	b.bytes -= s.size()
	c.live--
	c.held -= s.size()
	s.block = ccDead
}

// put writes a chunk known not to be held, evicting what the bounds ask.
func (c *chatCache) put(key uint64, ids []uint32, chunk string) {
	size := 4*int64(len(ids)) + int64(len(chunk))
	for c.live >= c.maxEntries && len(c.blocks) > 0 {
		c.evictOldest()
	}
	blk := min(int64(ccBlockBytes), max(c.budget/16, 1))
	last := len(c.blocks) - 1
	if last < 0 || int64(cap(c.blocks[last].buf)-len(c.blocks[last].buf)) < size {
		cp := max(blk, size)
		for c.arena+cp > c.budget && len(c.blocks) > 0 {
			c.evictOldest()
		}
		c.blocks = append(c.blocks, ccBlock{buf: make([]byte, 0, cp)})
		c.arena += cp
		last = len(c.blocks) - 1
	}
	b := &c.blocks[last]
	off := len(b.buf)
	for _, id := range ids {
		b.buf = binary.LittleEndian.AppendUint32(b.buf, id)
	}
	b.buf = append(b.buf, chunk...)
	b.live++
	b.bytes += size
	c.live++
	c.held += size
	if 4*(c.filled+1) > 3*len(c.slots) {
		c.rehash()
	}
	mask := len(c.slots) - 1
	i := ccHome(key, mask)
	for ; c.isLive(&c.slots[i]); i = (i + 1) & mask {
	}
	if c.slots[i].block == 0 {
		c.filled++
	}
	c.slots[i] = ccSlot{key: key, block: c.first + uint32(last) + 1, off: uint32(off), ids: uint32(len(ids)), text: uint32(len(chunk))}
}

// evictOldest drops the oldest block; its slots become tombstones.
func (c *chatCache) evictOldest() {
	b := c.blocks[0]
	c.live -= b.live
	c.held -= b.bytes
	c.arena -= int64(cap(b.buf))
	copy(c.blocks, c.blocks[1:])
	c.blocks[len(c.blocks)-1] = ccBlock{}
	c.blocks = c.blocks[:len(c.blocks)-1]
	c.first++
}

// rehash rebuilds the slot table with the live slots only, sized for at
// most half full after the next add.
func (c *chatCache) rehash() {
	n := 64
	for n < 2*(c.live+1) {
		n *= 2
	}
	old := c.slots
	c.slots = make([]ccSlot, n)
	c.filled = 0
	mask := n - 1
	for k := range old {
		s := &old[k]
		if !c.isLive(s) {
			continue
		}
		i := ccHome(s.key, mask)
		for c.slots[i].block != 0 {
			i = (i + 1) & mask
		}
		c.slots[i] = *s
		c.filled++
	}
}

// encode returns the ids of text (no post-processor tokens), reusing and
// filling the cache.
func (c *chatCache) encode(enc segmenter, text string) []uint32 {
	text = sanitizeUTF8(text)
	var segs []segment
	enc.segments(text, func(s segment) { segs = append(segs, s) })
	// Segments are contiguous: each ends where the next starts.
	end := func(k int) int {
		if k+1 < len(segs) {
			return segs[k+1].start
		}
		return len(text)
	}
	ids := make([]uint32, 0, len(text)/3+1)
	var prev uint64
	for i, from := 0, 0; i < len(segs); {
		j, to := i, from
		for j < len(segs) {
			to = end(j)
			j++
			if to-from >= chunkBytes {
				break
			}
		}
		chunk := text[from:to]
		var h maphash.Hash
		h.SetSeed(c.seed)
		var b [8]byte
		for k := range b {
			b[k] = byte(prev >> (8 * k))
		}
		h.Write(b[:])
		h.WriteString(chunk)
		key := h.Sum64()
		var hit bool
		if ids, hit = c.lookup(key, chunk, ids); !hit {
			start := len(ids)
			for _, s := range segs[i:j] {
				ids = enc.appendSegment(ids, s)
			}
			c.add(key, ids[start:], chunk)
		}
		prev, i, from = key, j, to
	}
	return ids
}
