package localrouter

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/kvevents"
)

// guardInfo is what the configuration guard knows of a worker.
type guardInfo struct {
	mismatched   uint64 // stored events rejected for their block size
	engineTokens int    // the block size they had
	notice       *kvevents.SkipNotice
	warnedAt     time.Time
}

func (ix *Index) guardOf(key WorkerKey) *guardInfo {
	if ix.guard == nil {
		ix.guard = make(map[WorkerKey]*guardInfo)
	}
	g := ix.guard[key]
	if g == nil {
		g = &guardInfo{}
		ix.guard[key] = g
	}
	return g
}

// ConfigWarning is the configuration guard: when worker key holds nothing
// in the index and its stored events are being skipped, it says why and
// which flag fixes it ("" when nothing is wrong). Its stores are skipped
// either before the index (the relay's SkipNotice) or at it (blocks of the
// wrong size, ErrBlockSizeMismatch).
func (ix *Index) ConfigWarning(key WorkerKey) string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.configWarning(key)
}

func (ix *Index) configWarning(key WorkerKey) string {
	g := ix.guard[key]
	if g == nil {
		return ""
	}
	if s, ok := ix.lookup(key); ok && ix.slots[s].size > 0 {
		return ""
	}
	switch {
	case g.mismatched > 0:
		return fmt.Sprintf("%d stored events refused: %s", g.mismatched, kvevents.BlockSizeAdvice(g.engineTokens, ix.blockSize))
	case g.notice != nil:
		return fmt.Sprintf("%d engine events skipped by its relay: %s", g.notice.Events, g.notice.Message())
	}
	return ""
}

// warnOnce returns the worker's configuration warning if it has one and
// none was returned for it in the last every (the router logs it), else "".
func (ix *Index) warnOnce(key WorkerKey, now time.Time, every time.Duration) string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	g := ix.guard[key]
	if g == nil || (!g.warnedAt.IsZero() && now.Sub(g.warnedAt) < every) {
		return ""
	}
	w := ix.configWarning(key)
	if w != "" {
		g.warnedAt = now
	}
	return w
}
