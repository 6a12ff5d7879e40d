package tokenizer

import (
	"fmt"
	"slices"
	"testing"
)

// FuzzChatCache drives the chat cache's storage with a random sequence of
// adds and lookups under small bounds, against a map of what was added: a
// hit returns exactly the ids added under that key and text, never other
// ids; a lookup with another text under the same key (a collision) misses;
// the accounting and the bounds hold after every step; the chunk just hit
// or added is held (the newest block is never evicted by its own add).
func FuzzChatCache(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte("a somewhat longer seed that adds and looks up many keys, over and over again"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		c := newChatCache(6)
		c.budget = 2048 // blocks of 128 bytes, chunks of at most 128
		model := map[uint64][]uint32{}
		for step, op := range ops {
			key := uint64(op % 29)
			n := int(op%7) * 3
			ids := make([]uint32, n)
			for k := range ids {
				ids[k] = uint32(key)*1000 + uint32(k)
			}
			text := fmt.Sprintf("text-%d", key)
			switch {
			case op&0x80 != 0:
				got, hit := c.lookup(key, text, []uint32{7})
				if hit {
					want, ok := model[key]
					if !ok || !slices.Equal(got[1:], want) || got[0] != 7 {
						t.Fatalf("step %d: lookup(%d) = %v, added %v (%v)", step, key, got, want, ok)
					}
					if i := c.find(key); i < 0 {
						t.Fatalf("step %d: key %d not held right after its hit", step, key)
					}
				}
				if _, hit := c.lookup(key, text+"x", nil); hit {
					t.Fatalf("step %d: lookup(%d) with another text hit", step, key)
				}
			default:
				if _, held := model[key]; held && c.find(key) >= 0 {
					continue // add of a held key is a no-op, as in encode
				}
				model[key] = ids
				c.add(key, ids, text)
				if 4*len(ids)+len(text) > 0 && c.find(key) < 0 {
					t.Fatalf("step %d: key %d not held right after its add", step, key)
				}
			}
			checkChatCache(t, c)
		}
	})
}
