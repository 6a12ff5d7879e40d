package localrouter

import (
	"sort"

	"github.com/kvgate/kvgate/kvevents"
)

// Dump returns the index as events that rebuild it when applied, in order,
// to an empty index of the same block size. Blocks carry local hashes, not
// token ids. A worker holding a block whose parent it does not hold is
// rebuilt with stand-in parents that are stored and then removed.
// Approximate-mode entries are dumped as stored blocks without TTL.
func (ix *Index) Dump() []kvevents.RouterEvent {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []kvevents.RouterEvent
	keys := make([]slotKey, 0, len(ix.table.byKey))
	for k := range ix.table.byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].ID != keys[j].ID {
			return keys[i].ID < keys[j].ID
		}
		if keys[i].DPRank != keys[j].DPRank {
			return keys[i].DPRank < keys[j].DPRank
		}
		return keys[i].tier < keys[j].tier
	})
	for _, key := range keys {
		out = ix.dumpSlot(out, ix.table.byKey[key])
	}
	return out
}

func (ix *Index) depthOf(n nodeID) int {
	d := 0
	for ; n != rootID; n = ix.tree.at(n).parent {
		d++
	}
	return d
}

func (ix *Index) dumpSlot(out []kvevents.RouterEvent, slot int32) []kvevents.RouterEvent {
	ss := &ix.slots[slot]
	type mapping struct {
		eh    uint64
		n     nodeID
		depth int
	}
	var ms []mapping
	for eh, n := range ss.engine {
		ms = append(ms, mapping{eh, n, ix.depthOf(n)})
	}
	// Approximate-mode entries have no engine hash: give them stand-ins.
	used := make(map[uint64]bool, len(ss.engine))
	for eh := range ss.engine {
		used[eh] = true
	}
	next := uint64(1) << 63
	fresh := func() uint64 {
		for used[next] {
			next++
		}
		used[next] = true
		return next
	}
	if len(ss.engine) == 0 && ss.size > 0 {
		ix.approx.each(func(_, s int32, n nodeID) {
			if s == slot && n != 0 { // a detached entry holds nothing
				ms = append(ms, mapping{fresh(), n, ix.depthOf(n)})
			}
		})
	}
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].depth != ms[j].depth {
			return ms[i].depth < ms[j].depth
		}
		return ms[i].eh < ms[j].eh
	})
	primary := make(map[nodeID]uint64, len(ms)) // node → an engine hash of it
	standIn := make(map[nodeID]uint64)
	var standIns []uint64
	var eventID uint64
	medium := ""
	if ss.tier != kvevents.TierGPU {
		medium = ss.tier.String()
	}
	emit := func(parent *uint64, blocks []kvevents.Block) {
		eventID++
		out = append(out, kvevents.RouterEvent{WorkerID: ss.key.ID, DPRank: ss.key.DPRank, EventID: eventID,
			Event: kvevents.Event{Stored: &kvevents.Stored{ParentHash: parent, Blocks: blocks, Medium: medium}}})
	}
	// parentRef returns the engine hash to store n's children under,
	// creating stand-ins for ancestors the worker does not hold.
	var parentRef func(n nodeID) *uint64
	parentRef = func(n nodeID) *uint64 {
		if n == rootID {
			return nil
		}
		if eh, ok := primary[n]; ok {
			return &eh
		}
		if eh, ok := standIn[n]; ok {
			return &eh
		}
		nn := ix.tree.at(n)
		pp := parentRef(nn.parent)
		eh := fresh()
		standIn[n] = eh
		standIns = append(standIns, eh)
		h := nn.local
		emit(pp, []kvevents.Block{{EngineHash: eh, LocalHash: &h}})
		return &eh
	}
	for _, m := range ms {
		mn := ix.tree.at(m.n)
		p := parentRef(mn.parent)
		h := mn.local
		emit(p, []kvevents.Block{{EngineHash: m.eh, LocalHash: &h}})
		if _, ok := primary[m.n]; !ok {
			primary[m.n] = m.eh
		}
	}
	if len(standIns) > 0 {
		eventID++
		out = append(out, kvevents.RouterEvent{WorkerID: ss.key.ID, DPRank: ss.key.DPRank, EventID: eventID,
			Event: kvevents.Event{Removed: &kvevents.Removed{EngineHashes: standIns, Medium: medium}}})
	}
	return out
}
