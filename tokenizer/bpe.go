package tokenizer

// bpe applies merges to a word's symbols, lowest rank first and leftmost
// among equal ranks, which is the order of both the Hugging Face tokenizers
// (a priority queue over (rank, position)) and tiktoken.
type bpe struct {
	// merges maps a pair of token ids (left<<32 | right) to
	// rank<<32 | merged id.
	merges map[uint64]uint64
	// pairs is merges as the table rank reads (see table.go).
	pairs *pairTable
}

const noRank = ^uint32(0)

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

func (m *bpe) rank(a, b uint32) (rank, id uint32) {
	v := m.pairs.get(pairKey(a, b))
	return uint32(v >> 32), uint32(v)
}

// smallWord is the size up to which the quadratic scan beats the heap.
const smallWord = 48

// merge merges sym in place and returns the merged prefix of it.
func (m *bpe) merge(sym []uint32) []uint32 {
	if len(sym) < 2 {
		return sym
	}
	if len(sym) > smallWord {
		return m.mergeLarge(sym)
	}
	var ranksBuf, idsBuf [smallWord]uint32
	n := len(sym)
	ranks, ids := ranksBuf[:n-1], idsBuf[:n-1]
	for i := 0; i < n-1; i++ {
		ranks[i], ids[i] = m.rank(sym[i], sym[i+1])
	}
	for n > 1 {
		best, at := noRank, -1
		for i, r := range ranks[:n-1] {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		sym[at] = ids[at]
		copy(sym[at+1:n], sym[at+2:n])
		copy(ranks[at:n-1], ranks[at+1:n-1])
		copy(ids[at:n-1], ids[at+1:n-1])
		n--
		if at > 0 {
			ranks[at-1], ids[at-1] = m.rank(sym[at-1], sym[at])
		}
		if at < n-1 {
			ranks[at], ids[at] = m.rank(sym[at], sym[at+1])
		}
	}
	return sym[:n]
}

// pairEntry is a candidate merge of the symbol at pos with the one at next.
type pairEntry struct {
	rank        uint32
	pos, next   int32
	left, right uint32
	merged      uint32
}

func (a pairEntry) less(b pairEntry) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

// mergeLarge is merge for long words (SentencePiece-style models see the
// whole text as one word): a heap of candidate pairs over a linked list,
// O(n log n). Stale heap entries are skipped when popped.
func (m *bpe) mergeLarge(sym []uint32) []uint32 {
	n := len(sym)
	prev := make([]int32, n)
	next := make([]int32, n)
	for i := range sym {
		prev[i], next[i] = int32(i-1), int32(i+1)
	}
	next[n-1] = -1
	h := make(pairHeap, 0, n)
	push := func(pos, nxt int32) {
		r, id := m.rank(sym[pos], sym[nxt])
		if r != noRank {
			h.push(pairEntry{rank: r, pos: pos, next: nxt, left: sym[pos], right: sym[nxt], merged: id})
		}
	}
	for i := 0; i < n-1; i++ {
		push(int32(i), int32(i+1))
	}
	dead := make([]bool, n)
	for len(h) > 0 {
		e := h.pop()
		if dead[e.pos] || next[e.pos] != e.next || dead[e.next] || sym[e.pos] != e.left || sym[e.next] != e.right {
			continue
		}
		sym[e.pos] = e.merged
		dead[e.next] = true
		nn := next[e.next]
		next[e.pos] = nn
		if nn >= 0 {
			prev[nn] = e.pos
			push(e.pos, nn)
		}
		if p := prev[e.pos]; p >= 0 {
			push(p, e.pos)
		}
	}
	out := sym[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, sym[i])
	}
	return out
}

type pairHeap []pairEntry

func (h *pairHeap) push(e pairEntry) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *pairHeap) pop() pairEntry {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(s) {
			break
		}
		c := l
		if r := l + 1; r < len(s) && s[r].less(s[l]) {
			c = r
		}
		if !s[c].less(s[i]) {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	*h = s
	return top
}
