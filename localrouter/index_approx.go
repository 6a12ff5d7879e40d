package localrouter

import (
	"time"
)

// Record inserts, in approximate mode, the blocks of a request routed to
// key: each (block, worker) entry lives for the TTL after its last Record.
// When entries exceed the bound, the oldest are pruned down to 80 %.
func (ix *Index) Record(now time.Time, key WorkerKey, localHashes []uint64) {
	if len(localHashes) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	slot := ix.slotFor(key)
	n, nn := rootID, ix.tree.at(rootID)
	exp := now.Add(ix.ttl)
	for _, h := range localHashes {
		c := ix.child(n, nn, h)
		if c == 0 {
			c = ix.addChild(n, h)
			ix.nodes++
		}
		cn := ix.tree.at(c)
		ix.holdNode(cn, slot)
		if i := ix.approx.findOn(slot, cn); i != 0 {
			ix.approx.touch(i, exp)
		} else {
			ix.approx.pushOn(slot, c, cn, exp)
			// The bound is checked once per Record (below), and the bound
			// plus one is a hard cap: a Record filling more than the room
			// left drops the oldest as it goes, uncounted.
			if ix.approx.len > ix.maxApprox+1 {
				ix.dropApprox(ix.approx.oldest()) // never c's: c is held, so its node stays
			}
		}
		n, nn = c, cn
	}
	if ix.approx.len > ix.maxApprox {
		target := ix.maxApprox * 8 / 10
		for ix.approx.len > target {
			ix.dropApprox(ix.approx.oldest())
			ix.pruned.Add(1)
		}
	}
	ix.expireLocked(now)
}

// Expire drops approximate-mode and predicted entries whose TTL passed.
func (ix *Index) Expire(now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.expireLocked(now)
	ix.expirePredictedLocked(now)
}

func (ix *Index) expireLocked(now time.Time) {
	for {
		i := ix.approx.oldest()
		if i == 0 || !ix.approx.expired(i, now) {
			return
		}
		ix.dropApprox(i)
	}
}

// dropApprox drops approximate-mode entry i and releases its node. Caller
// holds mu.
func (ix *Index) dropApprox(i int32) {
	slot, n := ix.approx.remove(i)
	// A node can be freed while it still has an entry (detached, n is 0)
	// only if the worker was removed or another entry of the worker
	// released it; then its slot no longer holds it, and there is nothing
	// to release.
	if n == 0 {
		return
	}
	ix.release(n, slot)
}
