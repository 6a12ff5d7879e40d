package localrouter

import "math/bits"

// workerSet is a set of worker slots: the first 64 slots inline (one word,
// enough for most pools, so a node needs no extra allocation), the rest in
// an overflow slice.
type workerSet struct {
	w0 uint64
	wx []uint64 // slots 64.., word i holds slots 64*(i+1)..
}

func (s *workerSet) has(slot int32) bool {
	if slot < 64 {
		return s.w0&(1<<uint(slot)) != 0
	}
	i := int(slot/64) - 1
	return i < len(s.wx) && s.wx[i]&(1<<uint(slot%64)) != 0
}

// add sets slot and reports whether it was absent.
func (s *workerSet) add(slot int32) bool {
	if slot < 64 {
		m := uint64(1) << uint(slot)
		if s.w0&m != 0 {
			return false
		}
		s.w0 |= m
		return true
	}
	i := int(slot/64) - 1
	for len(s.wx) <= i {
		s.wx = append(s.wx, 0)
	}
	m := uint64(1) << uint(slot%64)
	if s.wx[i]&m != 0 {
		return false
	}
	s.wx[i] |= m
	return true
}

// remove clears slot and reports whether it was present.
func (s *workerSet) remove(slot int32) bool {
	if !s.has(slot) {
		return false
	}
	if slot < 64 {
		s.w0 &^= 1 << uint(slot)
		return true
	}
	i := int(slot/64) - 1
	s.wx[i] &^= 1 << uint(slot%64)
	for len(s.wx) > 0 && s.wx[len(s.wx)-1] == 0 {
		s.wx = s.wx[:len(s.wx)-1]
	}
	if len(s.wx) == 0 {
		s.wx = nil
	}
	return true
}

func (s *workerSet) empty() bool { return s.w0 == 0 && len(s.wx) == 0 }

// words is a flat scratch bitset used on the read path: word 0 is slots 0..63.
type words []uint64

// load copies s into w (resized to cover s) and returns it.
func (w words) load(s *workerSet) words {
	w = append(w[:0], s.w0)
	return append(w, s.wx...)
}

// intersect keeps in w only the slots of s; it calls dropped(slot) for each
// slot it removes and reports whether any slot remains.
func (w words) intersect(s *workerSet, dropped func(slot int32)) bool {
	any := false
	for i := range w {
		var sw uint64
		if i == 0 {
			sw = s.w0
		} else if i-1 < len(s.wx) {
			sw = s.wx[i-1]
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
