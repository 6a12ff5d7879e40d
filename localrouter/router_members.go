package localrouter

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/kvgate/kvgate/kvevents"
)

// members is an immutable membership snapshot.
type members struct {
	keys  []WorkerKey // sorted
	slots []int32     // index slot of each key
	dp    map[string]int
}

// find returns the position of k in keys.
func (m *members) find(k WorkerKey) (int, bool) {
	i := sort.Search(len(m.keys), func(i int) bool {
		if m.keys[i].ID != k.ID {
			return m.keys[i].ID >= k.ID
		}
		return m.keys[i].DPRank >= k.DPRank
	})
	return i, i < len(m.keys) && m.keys[i] == k
}

func (m *members) has(k WorkerKey) bool {
	n, ok := m.dp[k.ID]
	return ok && int(k.DPRank) < n
}

func (m *members) with(id string, dpSize int, ix *Index) *members {
	n := &members{dp: make(map[string]int, len(m.dp)+1)}
	for k, v := range m.dp {
		n.dp[k] = v
	}
	if dpSize == 0 {
		delete(n.dp, id)
	} else {
		n.dp[id] = dpSize
	}
	for k, v := range n.dp {
		for d := 0; d < v; d++ {
			n.keys = append(n.keys, WorkerKey{ID: k, DPRank: uint32(d)})
		}
	}
	sort.Slice(n.keys, func(i, j int) bool {
		if n.keys[i].ID != n.keys[j].ID {
			return n.keys[i].ID < n.keys[j].ID
		}
		return n.keys[i].DPRank < n.keys[j].DPRank
	})
	n.slots = make([]int32, len(n.keys))
	for i, k := range n.keys {
		n.slots[i] = ix.ensureSlot(k)
	}
	return n
}

// AddWorker adds (or resizes) worker id with dpSize data-parallel ranks.
// A worker whose dp_size shrank loses its dropped ranks' index entries and
// requests, as a removed worker does.
func (r *Router) AddWorker(id string, dpSize int) {
	if dpSize < 1 {
		dpSize = 1
	}
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.memMu.Lock()
	old := r.members.Load()
	prev := old.dp[id]
	if prev == dpSize {
		r.memMu.Unlock()
		return
	}
	r.members.Store(old.with(id, dpSize, r.index))
	r.memMu.Unlock()
	if prev > dpSize {
		r.index.RemoveRanks(id, uint32(dpSize))
		r.active.RemoveRanks(id, uint32(dpSize))
		r.setSignals(id, nil, true)
	}
}

// SetWorkerStale marks worker id stale or not. A stale worker stays a
// member (its requests stay counted, its index part is kept) but BestWorker
// does not choose it while a fresh candidate is left. The mark is the
// worker's own (membership.WorkerInfo.Stale: its KV events cannot be
// published); RemoveWorker clears it.
func (r *Router) SetWorkerStale(id string, stale bool) {
	r.staleMu.Lock()
	defer r.staleMu.Unlock()
	old := *r.stale.Load()
	if old[id] == stale {
		return
	}
	next := make(map[string]bool, len(old)+1)
	for k := range old {
		next[k] = true
	}
	if stale {
		next[id] = true
	} else {
		delete(next, id)
	}
	r.stale.Store(&next)
}

// WorkerStale reports whether worker id is marked stale.
func (r *Router) WorkerStale(id string) bool { return (*r.stale.Load())[id] }

// RemoveWorker removes worker id: its index entries and active requests are
// dropped. It returns the ids of the requests it freed.
func (r *Router) RemoveWorker(id string) []string {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	r.memMu.Lock()
	old := r.members.Load()
	if _, ok := old.dp[id]; ok {
		r.members.Store(old.with(id, 0, r.index))
	}
	r.memMu.Unlock()
	r.index.RemoveWorker(id)
	r.setSignals(id, nil, false)
	r.SetWorkerStale(id, false)
	ids := r.active.RemoveWorker(id)
	r.chain.timing.cal.forget(ids...)
	return ids
}

// Workers returns the current members, one key per dp rank, sorted.
func (r *Router) Workers() []WorkerKey { return r.members.Load().keys }

// Ready reports whether at least MinInitialWorkers workers joined.
func (r *Router) Ready() bool { return len(r.members.Load().dp) >= r.cfg.MinInitialWorkers }

// ApplyEvent applies a KV event from a member worker. Events of workers that
// are not members are refused with ErrUnknownWorker and counted: their
// blocks are fetched with a dump when the worker joins.
func (r *Router) ApplyEvent(ev kvevents.RouterEvent) error {
	r.applyMu.RLock()
	defer r.applyMu.RUnlock()
	key := WorkerKey{ID: ev.WorkerID, DPRank: ev.DPRank}
	if !r.members.Load().has(key) {
		r.unknownWorkerEvents.Add(1)
		return fmt.Errorf("%w: %s/%d", ErrUnknownWorker, ev.WorkerID, ev.DPRank)
	}
	err := r.index.Apply(ev)
	if ev.Event.Skipped != nil || errors.Is(err, ErrBlockSizeMismatch) {
		// The configuration guard: say it once per worker, then rarely.
		if w := r.index.warnOnce(key, r.clock(), configWarnEvery); w != "" {
			r.log.Warn("worker's KV events are all skipped; fix its configuration", "worker", key.String(), "why", w)
		}
	}
	return err
}

// configWarnEvery bounds the configuration guard's log lines per worker.
const configWarnEvery = 10 * time.Minute

// ConfigWarning is the configuration guard's finding for a worker: why
// nothing it caches is indexed and which flag fixes it, "" when nothing
// is wrong (see Index.ConfigWarning).
func (r *Router) ConfigWarning(key WorkerKey) string { return r.index.ConfigWarning(key) }

// UnknownWorkerEvents counts events refused because their worker was not a
// member.
func (r *Router) UnknownWorkerEvents() uint64 { return r.unknownWorkerEvents.Load() }
