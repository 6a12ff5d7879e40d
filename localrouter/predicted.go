package localrouter

import (
	"sync/atomic"
	"time"
)

// Predicted entries (event mode): the blocks of a request routed to a
// worker, recorded at decision time with a short TTL so that the next
// decision sees them before the engine's own Stored events arrive (Dynamo's
// predicted index entries, llm-d's speculative indexing). They obey three
// rules, which keep the engine's events the truth:
//
//   - A Stored event for a predicted block confirms it: the entry becomes
//     the engine's, with no TTL, and is dropped only by the engine's
//     Removed or Cleared.
//   - A block the worker already holds (from an event) is never predicted,
//     so an entry's expiry never drops a block the engine holds, and a
//     Removed event only ever drops the engine's own mapping.
//   - A Cleared event (or the worker's removal) drops the worker's
//     predicted entries with its real ones.
//
// Predicted entries are local to the router that recorded them: Dump
// leaves them out (they are no engine state), and replicas learn only
// from their own decisions.

// predictions are the Index's predicted entries, oldest first. Guarded by
// the Index's mu.
type predictions struct {
	// list holds (slot, node) entries with their expiry. Every removal goes
	// through the Index, which releases the node.
	list entryList
	ttl  time.Duration
	max  int
	// perSlot counts each slot's entries, so that a worker without any is
	// skipped at once.
	perSlot []int32

	recorded, confirmed, expired atomic.Uint64
}

func (p *predictions) count(slot int32, d int32) {
	for int(slot) >= len(p.perSlot) {
		p.perSlot = append(p.perSlot, 0)
	}
	p.perSlot[slot] += d
}

func (p *predictions) has(slot int32) bool {
	return int(slot) < len(p.perSlot) && p.perSlot[slot] > 0
}

func (p *predictions) init(ttl time.Duration, max int, tree *nodeSlab) {
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	p.ttl, p.max = ttl, max
	p.list = newEntryList(predList, tree)
}

// PredictedStats are the counters of predicted entries.
type PredictedStats struct {
	// Entries is the number of predicted (block, worker) entries now held.
	Entries int
	// Recorded counts entries made; Confirmed those a Stored event turned
	// into real ones; Expired those dropped by their TTL (or the size
	// bound) before any event confirmed them.
	Recorded, Confirmed, Expired uint64
}

// PredictedStats returns the predicted entries' counters.
func (ix *Index) PredictedStats() PredictedStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return PredictedStats{
		Entries:   ix.pred.list.len,
		Recorded:  ix.pred.recorded.Load(),
		Confirmed: ix.pred.confirmed.Load(),
		Expired:   ix.pred.expired.Load(),
	}
}

// Predict records, in event mode, the blocks of a request routed to key
// as predicted entries that expire after the predicted TTL unless a Stored
// event confirms them. Blocks key already holds are left as they are;
// predicting a block again refreshes its TTL. When predicted entries
// exceed the size bound, the oldest are dropped down to 80 %.
func (ix *Index) Predict(now time.Time, key WorkerKey, localHashes []uint64) {
	if len(localHashes) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	p := &ix.pred
	slot := ix.slotFor(key)
	exp := now.Add(p.ttl)
	n, nn := rootID, ix.tree.at(rootID)
	for _, h := range localHashes {
		c := ix.child(n, nn, h)
		if c == 0 {
			c = ix.addChild(n, h)
			ix.nodes++
		}
		cn := ix.tree.at(c)
		// A predicted entry holds its slot on the node (ix.hold), so a
		// node without the slot has no entry, but for one case: the
		// worker's approximate-mode entry on it expired (Record and
		// Predict on one index), releasing it. Then, too, the entry is
		// refreshed, not doubled.
		i := p.list.findOn(slot, cn)
		switch {
		case !cn.workers.has(slot, &ix.wx):
			ix.holdNode(cn, slot)
			if i != 0 {
				p.list.touch(i, exp)
			} else {
				p.list.pushOn(slot, c, cn, exp)
			}
			p.count(slot, 1)
			p.recorded.Add(1)
		case i != 0:
			p.list.touch(i, exp)
		}
		n, nn = c, cn
	}
	if p.list.len > p.max {
		target := p.max * 8 / 10
		for p.list.len > target {
			ix.dropOldestPredicted()
		}
	}
	ix.expirePredictedLocked(now)
}

// dropOldestPredicted drops the oldest predicted entry. Caller holds mu.
func (ix *Index) dropOldestPredicted() {
	i := ix.pred.list.oldest()
	if i == 0 {
		return
	}
	slot, n := ix.pred.list.remove(i)
	ix.pred.count(slot, -1)
	ix.pred.expired.Add(1)
	if n == 0 { // detached: freed with its worker, or released by another entry
		return
	}
	ix.release(n, slot)
}

// expirePredictedLocked drops predicted entries whose TTL passed. Caller
// holds mu.
func (ix *Index) expirePredictedLocked(now time.Time) {
	for {
		i := ix.pred.list.oldest()
		if i == 0 || !ix.pred.list.expired(i, now) {
			return
		}
		ix.dropOldestPredicted()
	}
}

// confirmPredicted turns slot's predicted entry on n, if any, into
// nothing at all, leaving n unheld by slot but never pruned, so that the
// caller (a Stored event) holds it at once as the engine's. Caller holds mu.
func (ix *Index) confirmPredicted(slot int32, n nodeID) {
	if !ix.pred.has(slot) {
		return
	}
	i := ix.pred.list.find(slot, n)
	if i == 0 {
		return
	}
	ix.pred.list.remove(i)
	ix.pred.count(slot, -1)
	ix.pred.confirmed.Add(1)
	if ix.tree.at(n).workers.remove(slot, &ix.wx) {
		ix.slots[slot].size--
		ix.entries--
	}
}

// clearPredicted drops every predicted entry of slot. Caller holds mu.
func (ix *Index) clearPredicted(slot int32) {
	if !ix.pred.has(slot) {
		return
	}
	ix.pred.list.each(func(i, s int32, n nodeID) {
		if s != slot {
			return
		}
		ix.pred.list.remove(i)
		ix.pred.count(slot, -1)
		if n == 0 {
			return
		}
		ix.release(n, slot)
	})
}

// ConfirmedPrefix returns how many of the first upTo blocks of localHashes
// key holds for real (from the engine's events, or approximate-mode
// entries), stopping at the first block it does not hold or holds only as
// a prediction.
func (ix *Index) ConfirmedPrefix(key WorkerKey, localHashes []uint64, upTo int) int {
	if upTo > len(localHashes) {
		upTo = len(localHashes)
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	slot, ok := ix.lookup(key)
	if !ok {
		return 0
	}
	predicted := ix.pred.has(slot)
	id, n := rootID, ix.tree.at(rootID)
	for i := 0; i < upTo; i++ {
		c := ix.child(id, n, localHashes[i])
		if c == 0 {
			return i
		}
		n = ix.tree.at(c)
		if !n.workers.has(slot, &ix.wx) || (predicted && ix.pred.list.findOn(slot, n) != 0) {
			return i
		}
		id = c
	}
	return upTo
}

// hasPredicted reports whether any predicted entry is held.
func (ix *Index) hasPredicted() bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.pred.list.len > 0
}

// predicting reports whether placed requests record predicted entries.
func (r *Router) predicting() bool { return r.cfg.UseKVEvents && r.cfg.PredictedTTL > 0 }

// creditPredicted fills s.confirmed and re-costs the candidates whose
// overlap is partly predicted: a predicted block is still being computed
// for another request, so it saves this one its own prefill (credit 1) but
// earns none of the extra weight overlap_score_credit > 1 gives blocks the
// engine holds, which would otherwise draw a burst of identical prompts
// onto one worker before any of them is cached. With a credit ≤ 1 it
// changes no cost, and is not called (it walks each candidate's prefix).
func (r *Router) creditPredicted(p costParams, s *scratch, isl int) {
	s.confirmed = s.confirmed[:0]
	bs := r.cfg.BlockSize
	for j, l := range s.loads {
		conf := l.OverlapBlocks
		if conf > 0 {
			conf = r.index.ConfirmedPrefix(l.Worker, s.local, conf)
		}
		s.confirmed = append(s.confirmed, conf)
		if conf < l.OverlapBlocks {
			// Lower cache tiers' credit beyond the GPU overlap (as BestWorker
			// counts it) stays the engine's: only GPU blocks are predicted.
			held := float64(conf)
			if len(s.matches.Tiers) > 0 {
				if tm, ok := s.matches.TiersOf(l.Worker); ok {
					held += max(0, r.cfg.tierCredit(tm)-float64(l.OverlapBlocks))
				}
			}
			s.costs[j] = p.costPredicted(activePrefill(l, isl, bs), isl, bs, held, l.OverlapBlocks-conf, l.PotentialDecodeBlocks)
		}
	}
}

// costPredicted is cost with the overlap split into blocks the worker
// holds (confirmed, weighed by overlap_score_credit) and blocks only
// predicted there (weighed by min(credit, 1)).
func (p costParams) costPredicted(activePrefill, isl, blockSize int, confirmed float64, predicted, decodeBlocks int) float64 {
	prefillBlocks := float64(activePrefill+isl) / float64(blockSize)
	pf := prefillBlocks - p.credit*confirmed - min(p.credit, 1)*float64(predicted)
	if pf < 0 {
		pf = 0
	}
	c := p.scale * pf
	if p.trackBlocks {
		c += float64(decodeBlocks)
	}
	return c
}
