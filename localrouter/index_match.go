package localrouter

import (
	"github.com/kvgate/kvgate/kvevents"
)

// Overlap is one worker's match on one tier for a request.
type Overlap struct {
	Worker WorkerKey
	// Tier is the cache tier (kvevents.TierGPU for the engine's device
	// memory, the only one without offloading).
	Tier kvevents.Tier
	// Blocks is the number of leading request blocks the worker holds on
	// that tier.
	Blocks int
	// TreeSize is the number of blocks the worker holds in all on it.
	TreeSize int
}

// TierMatch is, for a worker holding blocks on a lower tier, how its
// leading run of request blocks held on any tier splits by tier: Blocks[t]
// counts the blocks of the run whose fastest tier holding them is t.
type TierMatch struct {
	Worker WorkerKey
	Blocks [kvevents.NumTiers]int
}

// Total is the length of the run.
func (t TierMatch) Total() int {
	n := 0
	for _, b := range t.Blocks {
		n += b
	}
	return n
}

// Matches is FindMatches' result. Reuse one across calls to avoid
// allocations; it is not safe for concurrent use.
type Matches struct {
	Overlaps []Overlap
	// Tiers holds one entry per worker that holds blocks on a lower tier
	// and matches at least the first block on some tier; workers without
	// lower-tier blocks have none (their GPU Overlap says it all).
	Tiers   []TierMatch
	scratch words
	slots   []int32  // index slot of each Overlaps entry
	pos     []int32  // index slot → 1 + position in Overlaps (0: none)
	path    []nodeID // matchTiers' walk
}

// TiersOf returns worker key's per-tier run (see TierMatch), or ok false
// if it holds nothing on a lower tier.
func (m *Matches) TiersOf(key WorkerKey) (TierMatch, bool) {
	for _, t := range m.Tiers {
		if t.Worker == key {
			return t, true
		}
	}
	return TierMatch{}, false
}

// ofSlot returns the overlap of the worker at index slot, checking that the
// slot still belongs to key (a slot can be reused after a removal).
func (m *Matches) ofSlot(slot int32, key WorkerKey) int {
	if slot < 0 || int(slot) >= len(m.pos) {
		return 0
	}
	p := m.pos[slot]
	if p == 0 || m.Overlaps[p-1].Worker != key || m.Overlaps[p-1].Tier != kvevents.TierGPU {
		return 0
	}
	return m.Overlaps[p-1].Blocks
}

// Of returns the GPU overlap of worker key, 0 if it matched nothing.
func (m *Matches) Of(key WorkerKey) int {
	for _, o := range m.Overlaps {
		if o.Worker == key && o.Tier == kvevents.TierGPU {
			return o.Blocks
		}
	}
	return 0
}

// FindMatches fills m with, for each worker tier holding at least the
// first block, the number of leading blocks of localHashes it holds and its
// tree size; it stops as soon as no tier of any worker matches. For workers
// holding blocks on lower tiers it fills m.Tiers too.
func (ix *Index) FindMatches(localHashes []uint64, m *Matches) {
	for _, s := range m.slots {
		m.pos[s] = 0
	}
	m.Overlaps, m.slots, m.Tiers = m.Overlaps[:0], m.slots[:0], m.Tiers[:0]
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if len(ix.tiered) > 0 {
		ix.matchTiers(localHashes, m)
	}
	id, n := rootID, ix.tree.at(rootID)
	depth := 0
	for i, h := range localHashes {
		c := ix.child(id, n, h)
		if c == 0 {
			break
		}
		cn := ix.tree.at(c)
		if i == 0 {
			m.scratch = m.scratch.load(&cn.workers, &ix.wx)
			if cn.workers.empty() {
				return
			}
		} else if !m.scratch.intersect(&cn.workers, &ix.wx, func(slot int32) { m.add(ix, slot, i) }) {
			return
		}
		id, n = c, cn
		depth = i + 1
	}
	if depth == 0 {
		return
	}
	for i, x := range m.scratch {
		for x != 0 {
			b := trailingZeros(x)
			x &= x - 1
			m.add(ix, int32(i*64+b), depth)
		}
	}
}

// matchTiers fills m.Tiers: for each worker with lower-tier slots, the
// leading run of request blocks it holds on any tier, each block counted at
// the fastest tier holding it. Caller holds mu.
func (ix *Index) matchTiers(localHashes []uint64, m *Matches) {
	m.path = m.path[:0]
	id, n := rootID, ix.tree.at(rootID)
	for _, h := range localHashes {
		c := ix.child(id, n, h)
		if c == 0 {
			break
		}
		m.path = append(m.path, c)
		id, n = c, ix.tree.at(c)
	}
	if len(m.path) == 0 {
		return
	}
	for key, ts := range ix.tiered {
		var slots [kvevents.NumTiers]int32
		for t := range slots {
			slots[t] = ts[t] - 1
		}
		if g, ok := ix.lookup(key); ok {
			slots[kvevents.TierGPU] = g
		}
		tm := TierMatch{Worker: key}
	walk:
		for _, c := range m.path {
			ws := &ix.tree.at(c).workers
			for t, s := range slots {
				if s >= 0 && ws.has(s, &ix.wx) {
					tm.Blocks[t]++
					continue walk
				}
			}
			break
		}
		if tm.Total() > 0 {
			m.Tiers = append(m.Tiers, tm)
		}
	}
}

func (m *Matches) add(ix *Index, slot int32, blocks int) {
	ss := &ix.slots[slot]
	m.Overlaps = append(m.Overlaps, Overlap{Worker: ss.key, Tier: ss.tier, Blocks: blocks, TreeSize: ss.size})
	m.slots = append(m.slots, slot)
	for int(slot) >= len(m.pos) {
		m.pos = append(m.pos, 0)
	}
	m.pos[slot] = int32(len(m.Overlaps))
}
