package localrouter

import "math/bits"

// workerSet is a set of worker slots: the first 64 slots inline (one word,
// enough for most pools), the rest in a block of the Index's word arena
// (wordArena), named by offset so that a node holds no pointer.
type workerSet struct {
	w0 uint64
	xo uint32 // first overflow word in the arena, 0: none; word i holds slots 64*(i+1)..
	xn uint16 // overflow words in use; the last one is non-zero
	xc uint8  // the block holds 1<<xc words; those past xn are zero
}

// wordArena holds the overflow words of every workerSet of an Index, in
// blocks of a power of two of words, with a free list per size. w[0] is
// unused so that offset 0 means none. Blocks are never given back to the
// runtime, only reused. Not safe for concurrent use: the Index's mu
// guards it (reads only read).
type wordArena struct {
	w    []uint64
	free [17]uint32 // per size class, the first free block (chained through its first word)
}

// alloc returns the offset of a zeroed block of 1<<c words.
func (a *wordArena) alloc(c uint8) uint32 {
	size := 1 << c
	if off := a.free[c]; off != 0 {
		a.free[c] = uint32(a.w[off])
		clear(a.w[off : int(off)+size])
		return off
	}
	if len(a.w) == 0 {
		a.w = append(a.w, 0)
	}
	off := len(a.w)
	if off+size > 1<<32 {
		panic("localrouter: worker set arena past 2^32 words")
	}
	a.w = append(a.w, make([]uint64, size)...)
	return uint32(off)
}

func (a *wordArena) release(off uint32, c uint8) {
	a.w[off] = uint64(a.free[c])
	a.free[c] = off
}

// overflow returns s's overflow words.
func (s *workerSet) overflow(a *wordArena) []uint64 {
	if s.xn == 0 {
		return nil
	}
	return a.w[s.xo : s.xo+uint32(s.xn)]
}

func (s *workerSet) has(slot int32, a *wordArena) bool {
	if slot < 64 {
		return s.w0&(1<<uint(slot)) != 0
	}
	i := int(slot/64) - 1
	return i < int(s.xn) && a.w[int(s.xo)+i]&(1<<uint(slot%64)) != 0
}

// add sets slot and reports whether it was absent.
func (s *workerSet) add(slot int32, a *wordArena) bool {
	if slot < 64 {
		m := uint64(1) << uint(slot)
		if s.w0&m != 0 {
			return false
		}
		s.w0 |= m
		return true
	}
	i := int(slot/64) - 1
	if i >= int(s.xn) {
		if i >= 1<<16-1 {
			panic("localrouter: worker slot past the worker set's range")
		}
		if s.xo == 0 || i >= 1<<s.xc {
			c := uint8(bits.Len(uint(i))) // 1<<c > i
			off := a.alloc(c)
			if s.xo != 0 {
				copy(a.w[off:], s.overflow(a))
				a.release(s.xo, s.xc)
			}
			s.xo, s.xc = off, c
		}
		s.xn = uint16(i + 1)
	}
	m := uint64(1) << uint(slot%64)
	w := &a.w[int(s.xo)+i]
	if *w&m != 0 {
		return false
	}
	*w |= m
	return true
}

// remove clears slot and reports whether it was present.
func (s *workerSet) remove(slot int32, a *wordArena) bool {
	if !s.has(slot, a) {
		return false
	}
	if slot < 64 {
		s.w0 &^= 1 << uint(slot)
		return true
	}
	i := int(slot/64) - 1
	a.w[int(s.xo)+i] &^= 1 << uint(slot%64)
	for s.xn > 0 && a.w[int(s.xo)+int(s.xn)-1] == 0 {
		s.xn--
	}
	if s.xn == 0 {
		a.release(s.xo, s.xc)
		s.xo, s.xc = 0, 0
	}
	return true
}

func (s *workerSet) empty() bool { return s.w0 == 0 && s.xn == 0 }

// words is a flat scratch bitset used on the read path: word 0 is slots 0..63.
type words []uint64

// load copies s into w (resized to cover s) and returns it.
func (w words) load(s *workerSet, a *wordArena) words {
	w = append(w[:0], s.w0)
	return append(w, s.overflow(a)...)
}

// intersect keeps in w only the slots of s; it calls dropped(slot) for each
// slot it removes and reports whether any slot remains.
func (w words) intersect(s *workerSet, a *wordArena, dropped func(slot int32)) bool {
	any := false
	x := s.overflow(a)
	for i := range w {
		var sw uint64
		if i == 0 {
			sw = s.w0
		} else if i-1 < len(x) {
			sw = x[i-1]
		}
		gone := w[i] &^ sw
		for gone != 0 {
			b := bits.TrailingZeros64(gone)
			gone &= gone - 1
			dropped(int32(i*64 + b))
		}
		w[i] &= sw
		if w[i] != 0 {
			any = true
		}
	}
	return any
}

func trailingZeros(x uint64) int { return bits.TrailingZeros64(x) }
