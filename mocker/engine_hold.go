package mocker

import "time"

// hold is a finished P/D prefill's pinned blocks and when they are
// released if no decode worker pulls them.
type hold struct {
	table []int32
	until time.Time
}

// holdOrRelease ends s's claim on its blocks at its finish (at): a
// HoldBlocks request keeps them referenced, as vLLM's NixlConnector does
// for a prefill whose request_finished returns delay_free_blocks
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
// NixlConnectorScheduler.request_finished, vllm-project/vllm@002a1057e9ae674d7bdc9c4be95bc29d65d2e808:
// only a request finished by its length cap, i.e. max_tokens 1, hands
// its blocks over); anything else releases them. It returns the held
// block ids.
func (e *Engine) holdOrRelease(s *seq, at time.Time) []int {
	if !s.req.HoldBlocks || len(s.table) == 0 {
		e.cache.release(s.table)
		return nil
	}
	if e.held == nil {
		e.held = make(map[string]hold)
	}
	e.held[s.req.ID] = hold{table: s.table, until: at.Add(e.cfg.KVHoldTimeout)}
	ids := make([]int, len(s.table))
	for i, b := range s.table {
		ids[i] = int(b)
	}
	return ids
}

// Held returns the block ids pinned for request id, and whether any are.
func (e *Engine) Held(id string) ([]int, bool) {
	h, ok := e.held[id]
	if !ok {
		return nil, false
	}
	ids := make([]int, len(h.table))
	for i, b := range h.table {
		ids[i] = int(b)
	}
	return ids, true
}

// ReleaseHeld unpins the blocks of a finished HoldBlocks request (a
// decode worker pulled them); they stay cached. It reports false when
// none are held for id (never held, already pulled, or expired).
func (e *Engine) ReleaseHeld(id string) bool {
	h, ok := e.held[id]
	if !ok {
		return false
	}
	delete(e.held, id)
	e.cache.release(h.table)
	return true
}

// expireHolds releases the holds whose timeout is at or before now, as
// vLLM's NIXL worker frees blocks past VLLM_NIXL_ABORT_REQUEST_TIMEOUT.
func (e *Engine) expireHolds(now time.Time) {
	for id, h := range e.held {
		if !h.until.After(now) {
			delete(e.held, id)
			e.cache.release(h.table)
			e.stats.ExpiredHolds++
		}
	}
}

// nextHoldExpiry is the earliest hold timeout, if any hold is pending.
func (e *Engine) nextHoldExpiry() (time.Time, bool) {
	var first time.Time
	ok := false
	for _, h := range e.held {
		if !ok || h.until.Before(first) {
			first, ok = h.until, true
		}
	}
	return first, ok
}
