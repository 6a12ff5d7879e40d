package mocker

import (
	"time"

	"github.com/kvgate/kvgate/kvevents"
)

func (e *Engine) earliestEligible() (time.Time, bool) {
	var first time.Time
	ok := false
	for _, s := range e.waiting {
		if !ok || s.eligible.Before(first) {
			first, ok = s.eligible, true
		}
	}
	return first, ok
}

// schedule forms the batch of an iteration starting at at, as vLLM v1 does:
// running sequences first (preempting from the back when blocks run out),
// then waiting ones in arrival order while the token budget, the sequence
// limit and the free blocks allow. It reports whether anything was
// scheduled.
func (e *Engine) schedule(at time.Time) bool {
	bs := e.cfg.BlockSize
	budget := e.cfg.MaxNumBatchedTokens
	var batch []scheduled
	preempted := false
	reload := 0 // tokens reloaded from the CPU tier in this iteration
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		numNew := min(len(s.tokens)-s.numComputed, budget)
		need := blocksFor(s.numComputed+numNew, bs) - len(s.table)
		for need > e.cache.numFree {
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if s.state != stateRunning {
			break
		}
		var ok bool
		s.table, ok = e.cache.allocate(s.table, need)
		if !ok {
			panic("mocker: allocation failed after preemption")
		}
		e.registerBlocks(s, s.numComputed+numNew)
		batch = append(batch, scheduled{s, numNew})
		budget -= numNew
	}
	// After a preemption vLLM admits nothing new, unless the batch is empty.
	for (!preempted || len(batch) == 0) && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		idx := -1
		for j, s := range e.waiting {
			if !s.eligible.After(at) {
				idx = j
				break
			}
		}
		if idx < 0 {
			break
		}
		s := e.waiting[idx]
		hits, cpuHits := 0, 0
		if !e.cfg.DisablePrefixCaching {
			limit := (len(s.tokens) - 1) / bs
			e.hashUpTo(s, limit)
			// At least one token is always computed, as in vLLM.
			hits = e.cache.matchPrefix(s.seqHashes[:limit])
			// The prefix continues on the CPU tier: reloaded, not computed.
			cpuHits = e.cache.matchCPU(s.seqHashes[hits:limit])
		}
		start := (hits + cpuHits) * bs
		numNew := min(len(s.tokens)-start, budget)
		if s.remote {
			// The KV of the prompt arrives whole; only the last token is
			// computed here, as a decode step.
			numNew = len(s.tokens) - start
		}
		need := blocksFor(start+numNew, bs) - hits
		inFree := 0
		for _, h := range s.seqHashes[:hits] {
			if e.cache.blocks[e.cache.cached[h]].inFree {
				inFree++
			}
		}
		if need+inFree > e.cache.numFree {
			break
		}
		if !s.counted {
			s.counted = true
			s.cachedTokens = start
			s.scheduled = at
			e.stats.PrefixQueryTokens += int64(s.promptLen)
			e.stats.PrefixHitTokens += int64(start)
			e.stats.CPUHitTokens += int64(cpuHits * bs)
		}
		if cpuHits > 0 {
			e.cache.touchCPU(s.seqHashes[hits : hits+cpuHits])
			reload += cpuHits * bs
		}
		s.table = e.cache.acquireCached(s.table[:0], s.seqHashes[:hits])
		s.table, _ = e.cache.allocate(s.table, need)
		s.numComputed, s.registered = start, hits
		if s.remote {
			// Transferred KV counts as computed but the last token.
			s.numComputed = len(s.tokens) - 1
			e.registerBlocks(s, len(s.tokens))
			numNew = 1
		} else {
			e.registerBlocks(s, start+numNew)
		}
		e.waiting = append(e.waiting[:idx], e.waiting[idx+1:]...)
		s.state = stateRunning
		e.running = append(e.running, s)
		batch = append(batch, scheduled{s, numNew})
		budget -= min(numNew, budget)
	}
	if len(batch) == 0 {
		return false
	}
	var shape Batch
	for _, b := range batch {
		if b.numNew == 1 && (b.s.output > 0 || b.s.remote) {
			shape.DecodeSeqs++
		} else {
			shape.PrefillTokens += b.numNew
		}
	}
	shape.KVUsage = e.cache.usage()
	e.stats.Iterations++
	d := e.cfg.Timing.IterationTime(shape)
	if reload > 0 {
		secs := float64(reload) * e.cfg.KVBytesPerToken / e.cfg.CPUReloadBandwidth / e.cfg.Speedup
		d += time.Duration(secs * float64(time.Second))
	}
	e.inflight = &iteration{batch: batch, end: at.Add(d)}
	return true
}

// registerBlocks offers every block of s complete within the first upTo
// tokens to the prefix cache, emitting Stored chains for those that join it.
func (e *Engine) registerBlocks(s *seq, upTo int) {
	if e.cfg.DisablePrefixCaching {
		return
	}
	bs := e.cfg.BlockSize
	full := upTo / bs
	if full <= s.registered {
		return
	}
	e.hashUpTo(s, full)
	var cur *kvevents.Stored
	for b := s.registered; b < full; b++ {
		h := s.seqHashes[b]
		if !e.cache.register(s.table[b], h) {
			cur = nil
			continue
		}
		if cur == nil {
			cur = &kvevents.Stored{LoRAName: s.req.LoRAName, CacheSalt: s.req.CacheSalt}
			if b > 0 {
				p := s.seqHashes[b-1]
				cur.ParentHash = &p
			}
			e.events = append(e.events, kvevents.Event{Stored: cur})
		}
		cur.Blocks = append(cur.Blocks, kvevents.Block{EngineHash: h, TokenIDs: s.tokens[b*bs : (b+1)*bs : (b+1)*bs]})
	}
	s.registered = full
}

// hashUpTo extends s.seqHashes to cover its first n complete blocks.
func (e *Engine) hashUpTo(s *seq, n int) {
	bs := e.cfg.BlockSize
	for b := len(s.seqHashes); b < n; b++ {
		h := kvevents.BlockHash(s.tokens[b*bs:(b+1)*bs], s.seed)
		if b > 0 {
			h = kvevents.ChainHash(s.seqHashes[b-1], h)
		}
		s.seqHashes = append(s.seqHashes, h)
	}
}

// preempt returns a running sequence to the front of the queue, releasing
// its blocks; it recomputes from scratch (reusing whatever stays cached).
func (e *Engine) preempt(s *seq) {
	e.running = removeSeq(e.running, s)
	e.cache.release(s.table)
	s.table = s.table[:0]
	s.numComputed, s.registered = 0, 0
	s.preemptions++
	s.state = stateWaiting
	s.eligible = s.arrival
	s.remote = false
	e.stats.Preemptions++
	e.waiting = append([]*seq{s}, e.waiting...)
}

// commit applies a finished iteration: every sequence that reached the end
// of its tokens samples one more.
func (e *Engine) commit(it *iteration, res *StepResult) {
	for _, b := range it.batch {
		s := b.s
		if s.state != stateRunning {
			continue // aborted while in flight
		}
		s.numComputed += b.numNew
		if s.numComputed < len(s.tokens) {
			continue // a prefill chunk
		}
		tok := e.nextToken(s)
		s.tokens = append(s.tokens, tok)
		s.output++
		since := it.end.Sub(s.lastToken)
		if s.firstToken.IsZero() {
			s.firstToken = it.end
			since = it.end.Sub(s.arrival)
		}
		s.lastToken = it.end
		res.Tokens = append(res.Tokens, Token{RequestID: s.req.ID, Index: s.output - 1, ID: tok, Since: since})
		if s.output >= s.req.MaxTokens {
			e.finish(s, it.end, res)
		}
	}
}

func (e *Engine) finish(s *seq, at time.Time, res *StepResult) {
	e.running = removeSeq(e.running, s)
	held := e.holdOrRelease(s, at)
	s.table = nil
	s.state = stateDone
	delete(e.seqs, s.req.ID)
	res.Completed = append(res.Completed, Completion{
		HeldBlocks:   held,
		RequestID:    s.req.ID,
		Arrival:      s.arrival,
		Scheduled:    s.scheduled,
		FirstToken:   s.firstToken,
		Finished:     at,
		PromptTokens: s.promptLen,
		CachedTokens: s.cachedTokens,
		OutputTokens: s.output,
		Preemptions:  s.preemptions,
		Reason:       FinishLength,
	})
}

// nextToken draws the next output token from a per-request deterministic
// stream (splitmix64), so equal requests generate equal outputs.
func (e *Engine) nextToken(s *seq) uint32 {
	s.rng += 0x9e3779b97f4a7c15
	z := s.rng
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return uint32(z % uint64(e.cfg.Vocab))
}

func seedFromID(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return h
}

func blocksFor(tokens, blockSize int) int { return (tokens + blockSize - 1) / blockSize }

func removeSeq(list []*seq, s *seq) []*seq {
	for i, x := range list {
		if x == s {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}
