package tokenizer

import (
	"hash/maphash"
	"strings"

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

// chatCache keeps the ids of rendered-chat segments, keyed by the hash of
// the rendered text up to and including the segment, so that turn n+1 of
// a conversation re-encodes only what turn n did not have. The segment's
// text is kept with its ids and compared on a hit, so a hash collision
// costs a re-encode, never wrong ids. Safe for concurrent use.
type chatCache struct {
	seed  maphash.Seed
	cache *lru.Cache[uint64, cachedSegment]
}

type cachedSegment struct {
	text string
	ids  []uint32
}

func newChatCache(size int) *chatCache {
	c, err := lru.New[uint64, cachedSegment](size)
	if err != nil {
		return nil // size <= 0: no cache
	}
	return &chatCache{seed: maphash.MakeSeed(), cache: c}
}

// encode returns the ids of text (no post-processor tokens), reusing and
// filling the cache.
func (c *chatCache) encode(enc segmenter, text string) []uint32 {
	text = sanitizeUTF8(text)
	ids := make([]uint32, 0, len(text)/3+1)
	var h maphash.Hash
	h.SetSeed(c.seed)
	enc.segments(text, func(s segment) {
		if s.isToken {
			var b [5]byte
			b[0] = 1
			b[1], b[2], b[3], b[4] = byte(s.id), byte(s.id>>8), byte(s.id>>16), byte(s.id>>24)
			h.Write(b[:])
			ids = append(ids, s.id)
			return
		}
		h.WriteByte(0)
		h.WriteString(s.text)
		key := h.Sum64()
		if hit, ok := c.cache.Get(key); ok && hit.text == s.text {
			ids = append(ids, hit.ids...)
			return
		}
		start := len(ids)
		ids = enc.appendSegment(ids, s)
		c.cache.Add(key, cachedSegment{text: s.text, ids: append([]uint32(nil), ids[start:]...)})
	})
	return ids
}
