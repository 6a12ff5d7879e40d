package localrouter

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/kvevents"
)

// Apply applies one event. A rejected event changes nothing; the error says
// why. Removals of engine hashes the worker does not hold are skipped and
// counted, not errors.
func (ix *Index) Apply(ev kvevents.RouterEvent) error {
	if err := ev.Validate(); err != nil {
		ix.rejected.Add(1)
		return err
	}
	key := WorkerKey{ID: ev.WorkerID, DPRank: ev.DPRank}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var err error
	switch {
	case ev.Event.Stored != nil:
		err = ix.applyStored(key, ev.Event.Stored)
	case ev.Event.Removed != nil:
		ix.applyRemoved(key, ev.Event.Removed)
	case ev.Event.Cleared:
		for t := kvevents.Tier(0); t < kvevents.NumTiers; t++ {
			if s, ok := ix.table.lookup(slotKey{key, t}); ok {
				ix.clearSlot(s)
			}
		}
	case ev.Event.Skipped != nil:
		g := ix.guardOf(key)
		n := *ev.Event.Skipped
		g.notice = &n
	}
	if err != nil {
		ix.rejected.Add(1)
		if errors.Is(err, ErrBlockSizeMismatch) {
			g := ix.guardOf(key)
			g.mismatched++
			for _, b := range ev.Event.Stored.Blocks {
				if len(b.TokenIDs) != ix.blockSize && len(b.TokenIDs) > 0 {
					g.engineTokens = len(b.TokenIDs)
					break
				}
			}
		}
		return fmt.Errorf("event %d of worker %s: %w", ev.EventID, key, err)
	}
	ix.applied.Add(1)
	return nil
}

func (ix *Index) applyStored(key WorkerKey, st *kvevents.Stored) error {
	// Check everything before touching the tree: never half-applied.
	seed := kvevents.ChainSeed(st.LoRAName, st.CacheSalt)
	tier, ok := kvevents.TierOf(st.Medium)
	if !ok {
		return fmt.Errorf("%w: unknown medium %q", kvevents.ErrInvalidEvent, st.Medium)
	}
	byRef := false
	for i, b := range st.Blocks {
		if len(b.TokenIDs) > 0 && len(b.TokenIDs) != ix.blockSize {
			return fmt.Errorf("%w: block %d has %d tokens, block size is %d", ErrBlockSizeMismatch, i, len(b.TokenIDs), ix.blockSize)
		}
		if len(b.TokenIDs) == 0 && b.LocalHash == nil {
			byRef = true
		}
	}
	if byRef {
		ix.storeByRef(key, tier, st)
		return nil
	}
	parent := rootID
	if st.ParentHash != nil {
		p := ix.findEngine(key, tier, *st.ParentHash)
		if p == 0 {
			return fmt.Errorf("%w: parent engine hash %d", ErrUnknownParent, *st.ParentHash)
		}
		parent = p
	}
	slot := ix.tierSlotFor(key, tier)
	ss := &ix.slots[slot]
	for _, b := range st.Blocks {
		h := b.Hash(seed)
		c := ix.childOf(parent, h)
		if c == 0 {
			c = ix.addChild(parent, h)
			ix.nodes++
		}
		old, remap := ss.engine[b.EngineHash]
		if remap && old == c {
			parent = c // a duplicate store
			continue
		}
		ss.engine[b.EngineHash] = c
		ix.confirmPredicted(slot, c)
		if !ix.hold(c, slot) {
			if ss.aliases == nil {
				ss.aliases = make(map[nodeID]int32)
			}
			ss.aliases[c]++
		}
		if remap {
			// The engine reused a hash for other content: drop the old
			// mapping. c is held now, so pruning stops at it or below.
			ix.drop(slot, old)
		}
		ix.stored.Add(1)
		parent = c
	}
	return nil
}

// storeByRef applies a lower-tier Stored whose blocks carry only engine
// hashes: each names a block the worker announced on another tier, which
// now is held on tier as well. Blocks it holds nowhere are counted and
// skipped. Caller holds mu.
func (ix *Index) storeByRef(key WorkerKey, tier kvevents.Tier, st *kvevents.Stored) {
	slot := int32(-1)
	for _, b := range st.Blocks {
		n := ix.findEngine(key, tier, b.EngineHash)
		if n == 0 {
			ix.refUnknown.Add(1)
			continue
		}
		if slot < 0 {
			slot = ix.tierSlotFor(key, tier)
		}
		ss := &ix.slots[slot]
		old, remap := ss.engine[b.EngineHash]
		if remap && old == n {
			continue
		}
		ss.engine[b.EngineHash] = n
		if !ix.hold(n, slot) {
			if ss.aliases == nil {
				ss.aliases = make(map[nodeID]int32)
			}
			ss.aliases[n]++
		}
		if remap {
			ix.drop(slot, old)
		}
		ix.stored.Add(1)
	}
}

// unmap removes one engine-hash mapping of slot. Caller holds mu.
func (ix *Index) unmap(slot int32, eh uint64, n nodeID) {
	delete(ix.slots[slot].engine, eh)
	ix.drop(slot, n)
}

// drop releases one mapping of slot to n: an alias if there is one, else
// the node itself. Caller holds mu.
func (ix *Index) drop(slot int32, n nodeID) {
	ss := &ix.slots[slot]
	if a := ss.aliases[n]; a > 0 {
		if a == 1 {
			delete(ss.aliases, n)
		} else {
			ss.aliases[n] = a - 1
		}
		return
	}
	ix.release(n, slot)
}

func (ix *Index) applyRemoved(key WorkerKey, rm *kvevents.Removed) {
	tier, _ := kvevents.TierOf(rm.Medium)
	slot, ok := ix.table.lookup(slotKey{key, tier})
	if !ok {
		ix.removedUnknown.Add(uint64(len(rm.EngineHashes)))
		return
	}
	for _, eh := range rm.EngineHashes {
		n, ok := ix.slots[slot].engine[eh]
		if !ok {
			ix.removedUnknown.Add(1)
			continue
		}
		ix.unmap(slot, eh, n)
	}
}

// clearSlot drops every block of slot, keeping the slot. Caller holds mu.
func (ix *Index) clearSlot(slot int32) {
	ix.clearPredicted(slot)
	ss := &ix.slots[slot]
	// An aliased node is released once; its other mappings find it freed
	// (a zeroed node in the free list: nothing is allocated meanwhile), so
	// their release is a no-op, as before.
	for _, n := range ss.engine {
		ix.release(n, slot)
	}
	ss.engine = make(map[uint64]nodeID)
	ss.aliases = nil
	if ss.size > 0 { // approximate-mode entries
		ix.approx.each(func(i, s int32, _ nodeID) {
			if s == slot {
				ix.dropApprox(i)
			}
		})
	}
}

// RemoveWorker drops everything the worker (all its dp ranks) holds.
func (ix *Index) RemoveWorker(id string) { ix.RemoveRanks(id, 0) }

// RemoveRanks drops everything worker id's ranks from fromRank up hold
// (a worker whose dp_size shrank).
func (ix *Index) RemoveRanks(id string, fromRank uint32) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for key, slot := range ix.table.byKey {
		if key.ID != id || key.DPRank < fromRank {
			continue
		}
		ix.clearSlot(slot)
		ix.slots[slot] = slotState{}
		ix.table.release(key)
		delete(ix.tiered, key.WorkerKey)
		delete(ix.guard, key.WorkerKey)
	}
}
