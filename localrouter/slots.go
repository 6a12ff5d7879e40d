package localrouter

// slotTable gives each key (a WorkerKey, or a worker's cache tier) a small
// dense number, reusing the numbers of released keys, so per-worker state
// can live in slices and bitsets. Not safe for concurrent use: its owner's
// lock guards it.
type slotTable[K comparable] struct {
	byKey map[K]int32
	free  []int32
	n     int32 // slots ever handed out
}

func newSlotTable[K comparable]() slotTable[K] { return slotTable[K]{byKey: make(map[K]int32)} }

func (t *slotTable[K]) lookup(k K) (int32, bool) {
	s, ok := t.byKey[k]
	return s, ok
}

// acquire returns k's slot, and fresh = true when k just got it (the
// caller then initialises its state; a slot == len(state) needs a new
// element).
func (t *slotTable[K]) acquire(k K) (slot int32, fresh bool) {
	if s, ok := t.byKey[k]; ok {
		return s, false
	}
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		slot = t.n
		t.n++
	}
	t.byKey[k] = slot
	return slot, true
}

// release frees k's slot for reuse.
func (t *slotTable[K]) release(k K) {
	if s, ok := t.byKey[k]; ok {
		delete(t.byKey, k)
		t.free = append(t.free, s)
	}
}

// grow returns s with an element at index slot.
func grow[T any](s []T, slot int32) []T {
	for int(slot) >= len(s) {
		var zero T
		s = append(s, zero)
	}
	return s
}
