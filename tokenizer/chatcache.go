package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync/atomic"

	lru "github.com/hashicorp/golang-lru/v2"
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
// bytes its entries hold (chatCacheBytes), so a few huge prompts cannot
// hold gigabytes.
type chatCache struct {
	seed   maphash.Seed
	cache  *lru.Cache[uint64, cachedChunk]
	used   atomic.Int64 // bytes held: text plus 4 per id
	budget int64        // chatCacheBytes but in tests
}

// chatCacheBytes bounds the bytes one model's chat cache holds.
const chatCacheBytes = 64 << 20

func (e cachedChunk) size() int64 { return int64(len(e.text) + 4*len(e.ids)) }

type cachedChunk struct {
	text string
	ids  []uint32
}

// chunkBytes trades per-lookup overhead against the re-encoded tail.
const chunkBytes = 256

func newChatCache(size int) *chatCache {
	cc := &chatCache{seed: maphash.MakeSeed(), budget: chatCacheBytes}
	c, err := lru.NewWithEvict[uint64, cachedChunk](size, func(_ uint64, e cachedChunk) { cc.used.Add(-e.size()) })
	if err != nil {
		return nil // size <= 0: no cache
	}
	cc.cache = c
	return cc
}

func (c *chatCache) add(key uint64, e cachedChunk) {
	if e.size() > c.budget/16 {
		return // too big to be worth its room
	}
	if present, _ := c.cache.ContainsOrAdd(key, e); present {
		return // another request added it meanwhile
	}
	c.used.Add(e.size())
	for c.used.Load() > c.budget {
		if _, _, ok := c.cache.RemoveOldest(); !ok {
			break
		}
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
		if hit, ok := c.cache.Get(key); ok && hit.text == chunk {
			ids = append(ids, hit.ids...)
		} else {
			start := len(ids)
			for _, s := range segs[i:j] {
				ids = enc.appendSegment(ids, s)
			}
			c.add(key, cachedChunk{text: chunk, ids: append([]uint32(nil), ids[start:]...)})
		}
		prev, i, from = key, j, to
	}
	return ids
}
