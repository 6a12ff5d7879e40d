package mocker

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/membership"
)

// Config sizes and shapes an Engine. The zero value of each field means its
// default.
type Config struct {
	// BlockSize is the KV block size in tokens (16).
	BlockSize int
	// NumBlocks is the KV cache capacity in blocks (8192).
	NumBlocks int
	// MaxNumSeqs bounds the running sequences (256).
	MaxNumSeqs int
	// MaxNumBatchedTokens bounds the tokens computed per iteration (8192);
	// longer prompts are prefilled in chunks.
	MaxNumBatchedTokens int
	// DisablePrefixCaching turns off prefix reuse and KV events.
	DisablePrefixCaching bool
	// Role is membership.RoleAggregated (default), RolePrefill (every request
	// stops after its first token) or RoleDecode (requests with
	// RemotePrefill skip local prefill and pay a KV transfer instead).
	Role membership.Role
	// Timing prices iterations; nil means DefaultTiming{Speedup: Speedup}.
	Timing Timing
	// Speedup divides the default timing model's durations (1).
	Speedup float64
	// KVBytesPerToken is the KV size of one token, for transfer times
	// (131072: a Llama-3-8B-like model in fp16).
	KVBytesPerToken float64
	// KVTransferBandwidth is the prefill → decode bandwidth in bytes/s
	// (25e9).
	KVTransferBandwidth float64
	// Vocab is the range of generated token ids (32000).
	Vocab int
	// CPUBlocks is the capacity of a host-memory (CPU) KV tier in blocks
	// (0: none), as vLLM's CPU offloading or LMCache keeps one: a cached
	// block evicted from the GPU is offloaded there (Stored with medium CPU,
	// then Removed from the GPU), the tier evicts least recently used, and
	// a prefix found there is reloaded instead of recomputed.
	CPUBlocks int
	// CPUReloadBandwidth is the CPU → GPU bandwidth of a reload in bytes/s
	// (25e9, PCIe 4.0 x16): reloading t tokens takes t × KVBytesPerToken /
	// CPUReloadBandwidth, much less than prefilling them.
	CPUReloadBandwidth float64
}

// Defaults returns c with every unset field set to its default.
func (c Config) Defaults() Config { return c.withDefaults() }

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BlockSize, 16)
	def(&c.NumBlocks, 8192)
	def(&c.MaxNumSeqs, 256)
	def(&c.MaxNumBatchedTokens, 8192)
	def(&c.Vocab, 32000)
	if c.Role == "" {
		c.Role = membership.RoleAggregated
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.Timing == nil {
		c.Timing = DefaultTiming{Speedup: c.Speedup}
	}
	if c.KVBytesPerToken == 0 {
		c.KVBytesPerToken = 131072
	}
	if c.KVTransferBandwidth == 0 {
		c.KVTransferBandwidth = 25e9
	}
	if c.CPUReloadBandwidth == 0 {
		c.CPUReloadBandwidth = 25e9
	}
	return c
}

// Validate reports a configuration the engine cannot run.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.BlockSize < 0 || c.NumBlocks < 0 || c.MaxNumSeqs < 0 || c.MaxNumBatchedTokens < 0 || c.Vocab < 0:
		return fmt.Errorf("%w: sizes must not be negative", ErrConfig)
	case c.MaxNumBatchedTokens < c.BlockSize:
		return fmt.Errorf("%w: max batched tokens %d below block size %d", ErrConfig, c.MaxNumBatchedTokens, c.BlockSize)
	case c.Speedup < 0:
		return fmt.Errorf("%w: speedup %v must be positive", ErrConfig, c.Speedup)
	case c.CPUBlocks < 0:
		return fmt.Errorf("%w: cpu blocks %d must not be negative", ErrConfig, c.CPUBlocks)
	case c.KVBytesPerToken < 0 || c.KVTransferBandwidth < 0 || c.CPUReloadBandwidth < 0:
		return fmt.Errorf("%w: kv transfer parameters must be positive", ErrConfig)
	}
	switch c.Role {
	case membership.RoleAggregated, membership.RolePrefill, membership.RoleDecode:
	default:
		return fmt.Errorf("%w: unknown role %q (want aggregated, prefill or decode)", ErrConfig, c.Role)
	}
	return nil
}

// Errors of the engine core.
var (
	// ErrConfig reports an invalid Config.
	ErrConfig = errors.New("invalid mocker config")
	// ErrBadRequest reports a request the engine refuses: empty id or
	// prompt, MaxTokens ≤ 0, a duplicate id.
	ErrBadRequest = errors.New("bad request")
	// ErrTooLong reports a request whose prompt plus MaxTokens could never
	// fit in the KV cache.
	ErrTooLong = errors.New("request does not fit in the kv cache")
)

// Request is one generation request as the engine sees it: token ids in,
// MaxTokens tokens out (the mocker never stops early).
type Request struct {
	ID        string
	Tokens    []uint32
	MaxTokens int
	// LoRAName selects the adapter; blocks of different adapters never
	// share cache entries.
	LoRAName string
	// RemotePrefill marks a request whose KV is computed by a prefill worker
	// (the x-prefiller-host-port header). Only a decode-role engine honours
	// it: instead of prefilling, the request waits ISL × KVBytesPerToken /
	// KVTransferBandwidth, then starts decoding.
	RemotePrefill bool
}

// Token is one generated token.
type Token struct {
	RequestID string
	// Index is the token's position in the output, 0 for the first.
	Index int
	ID    uint32
}

// Finish reasons of a Completion.
const (
	FinishLength = "length"
	FinishAbort  = "abort"
)

// Completion is the record of a finished request.
type Completion struct {
	RequestID string
	// Arrival is when Submit was called; FirstToken when the first token was
	// produced (zero if none); Finished when the last was.
	Arrival, FirstToken, Finished time.Time
	PromptTokens                  int
	// CachedTokens is the prompt tokens served from the prefix cache when
	// the request was first scheduled.
	CachedTokens int
	OutputTokens int
	Preemptions  int
	// Reason is FinishLength or FinishAbort.
	Reason string
}

// TTFT is the time to first token (0 if no token was produced).
func (c Completion) TTFT() time.Duration {
	if c.FirstToken.IsZero() {
		return 0
	}
	return c.FirstToken.Sub(c.Arrival)
}

// StepResult is what happened while Step advanced the engine.
type StepResult struct {
	// Tokens generated, in order; a token with Index 0 marks the end of its
	// request's prefill.
	Tokens []Token
	// Completed requests, in order.
	Completed []Completion
	// Events are the KV events (Stored, Removed; engine hashes are the
	// blocks' kvgate sequence hashes) in the order the cache changed.
	Events []kvevents.Event
	// Next is when Step must be called again (the end of the iteration in
	// flight, or the moment a KV transfer completes); zero when the engine
	// is idle until the next Submit.
	Next time.Time
}

// Stats is a snapshot of the engine's gauges and counters.
type Stats struct {
	Running, Waiting int
	// KVUsage is the fraction of KV blocks in use by requests.
	KVUsage float64
	// UsedBlocks are referenced by requests; CachedBlocks are registered
	// for prefix reuse (in use or free).
	UsedBlocks, CachedBlocks, TotalBlocks int
	// PrefixQueryTokens and PrefixHitTokens count prompt tokens looked up
	// in and served from the prefix cache.
	PrefixQueryTokens, PrefixHitTokens int64
	Preemptions                        int64
	Iterations                         int64
	// EvictedBlocks counts cached blocks evicted for reuse.
	EvictedBlocks int64
	// CPUBlocks are held on the CPU tier; CPUHitTokens (part of
	// PrefixHitTokens) were reloaded from it; OffloadedBlocks went there.
	CPUBlocks                     int
	CPUHitTokens, OffloadedBlocks int64
}

type seqState int8

const (
	stateWaiting seqState = iota
	stateRunning
	stateDone
)

type seq struct {
	req       Request
	tokens    []uint32 // prompt then output
	promptLen int
	seed      uint64
	seqHashes []uint64 // of the complete blocks of tokens, grown lazily
	table     []int32
	// numComputed tokens have KV; registered blocks (a prefix of table)
	// were offered to the cache's registry.
	numComputed, registered int
	output                  int
	arrival, eligible       time.Time
	firstToken              time.Time
	cachedTokens            int
	preemptions             int
	counted                 bool
	remote                  bool
	state                   seqState
	rng                     uint64
}

type scheduled struct {
	s      *seq
	numNew int
}

type iteration struct {
	batch []scheduled
	end   time.Time
}

// Engine is the simulated engine core: a paged KV cache, a continuous
// batching scheduler and a timing model, advanced in discrete steps by its
// caller. See the package documentation for the protocol. Not safe for
// concurrent use.
type Engine struct {
	cfg      Config
	cache    *kvCache
	events   []kvevents.Event
	seqs     map[string]*seq
	waiting  []*seq
	running  []*seq
	inflight *iteration
	// free is when the engine finished its last iteration.
	free  time.Time
	stats Stats
}

// NewEngine returns an idle engine with an empty cache.
func NewEngine(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e := &Engine{cfg: cfg, seqs: make(map[string]*seq)}
	e.cache = newKVCache(cfg.NumBlocks, cfg.BlockSize, &e.events)
	e.cache.cpuCap = cfg.CPUBlocks
	return e, nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Submit queues r, arriving at now. Call Step(now) afterwards: an idle engine
// starts only when stepped. The engine keeps r.Tokens (do not modify it).
func (e *Engine) Submit(now time.Time, r Request) error {
	switch {
	case r.ID == "":
		return fmt.Errorf("%w: empty request id", ErrBadRequest)
	case len(r.Tokens) == 0:
		return fmt.Errorf("%w: request %q: empty prompt", ErrBadRequest, r.ID)
	case r.MaxTokens <= 0:
		return fmt.Errorf("%w: request %q: max tokens %d must be positive", ErrBadRequest, r.ID, r.MaxTokens)
	}
	if _, dup := e.seqs[r.ID]; dup {
		return fmt.Errorf("%w: request %q already in flight", ErrBadRequest, r.ID)
	}
	maxTokens := r.MaxTokens
	if e.cfg.Role == membership.RolePrefill {
		maxTokens = 1
	}
	if need := blocksFor(len(r.Tokens)+maxTokens, e.cfg.BlockSize); need > e.cfg.NumBlocks {
		return fmt.Errorf("%w: request %q needs %d blocks, the cache has %d", ErrTooLong, r.ID, need, e.cfg.NumBlocks)
	}
	r.MaxTokens = maxTokens
	s := &seq{
		req:       r,
		tokens:    r.Tokens[:len(r.Tokens):len(r.Tokens)],
		promptLen: len(r.Tokens),
		seed:      kvevents.LoRASeed(r.LoRAName),
		arrival:   now,
		eligible:  now,
		remote:    r.RemotePrefill && e.cfg.Role == membership.RoleDecode,
		rng:       seedFromID(r.ID),
	}
	if s.remote {
		secs := float64(len(r.Tokens)) * e.cfg.KVBytesPerToken / e.cfg.KVTransferBandwidth / e.cfg.Speedup
		s.eligible = now.Add(time.Duration(secs * float64(time.Second)))
	}
	e.seqs[r.ID] = s
	e.waiting = append(e.waiting, s)
	return nil
}

// Abort drops a queued or running request, freeing its blocks (they stay
// cached). It reports false for an unknown id. The aborted request yields no
// further tokens and no Completion.
func (e *Engine) Abort(id string) bool {
	s, ok := e.seqs[id]
	if !ok {
		return false
	}
	delete(e.seqs, id)
	switch s.state {
	case stateWaiting:
		e.waiting = removeSeq(e.waiting, s)
	case stateRunning:
		e.running = removeSeq(e.running, s)
	}
	e.cache.release(s.table)
	s.table = nil
	s.state = stateDone
	return true
}

// Step advances the engine to now: it completes every iteration that ends
// at or before now (producing tokens, completions and KV events stamped at
// the iteration's end) and starts the next iteration whenever there is work.
// Iterations run back to back while there is work; an idle engine starts at
// the arrival of the first schedulable request.
func (e *Engine) Step(now time.Time) StepResult {
	var res StepResult
	for {
		if e.inflight != nil {
			if e.inflight.end.After(now) {
				break
			}
			e.commit(e.inflight, &res)
			e.free = e.inflight.end
			e.inflight = nil
		}
		at := e.free
		if len(e.running) == 0 {
			first, ok := e.earliestEligible()
			if !ok || first.After(now) {
				break
			}
			if first.After(at) {
				at = first
			}
		}
		if !e.schedule(at) {
			break
		}
	}
	res.Events = e.takeEvents()
	if e.inflight != nil {
		res.Next = e.inflight.end
	} else if first, ok := e.earliestEligible(); ok {
		res.Next = first
		if !first.After(now) {
			// Schedulable now but nothing fits: cannot happen while Submit
			// bounds requests by the cache size; wake at once to be safe.
			res.Next = now
		}
	}
	return res
}

// Stats returns the current gauges and counters.
func (e *Engine) Stats() Stats {
	st := e.stats
	st.Running, st.Waiting = len(e.running), len(e.waiting)
	st.KVUsage = e.cache.usage()
	st.UsedBlocks = e.cache.used()
	st.CachedBlocks = len(e.cache.cached)
	st.TotalBlocks = e.cfg.NumBlocks
	st.EvictedBlocks = e.cache.evictions
	st.CPUBlocks = e.cache.cpuLen()
	st.OffloadedBlocks = e.cache.offloads
	return st
}

// CachedBlocks returns the sequence hashes of every block registered in the
// prefix cache: the set a router's index of this worker should hold once it
// has applied every event the engine emitted.
func (e *Engine) CachedBlocks() map[uint64]struct{} { return e.cache.contents() }

// ResetPrefixCache forgets every cached block, as vLLM's
// /reset_prefix_cache does: it succeeds only when no request holds blocks,
// and then emits a Cleared event (in the next StepResult). It reports
// whether the cache was reset.
func (e *Engine) ResetPrefixCache() bool { return e.cache.reset() }

// Pending reports whether requests are queued or running.
func (e *Engine) Pending() bool { return len(e.waiting)+len(e.running) > 0 }

func (e *Engine) takeEvents() []kvevents.Event {
	if len(e.events) == 0 {
		return nil
	}
	ev := e.events
	e.events = nil
	return ev
}

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
			cur = &kvevents.Stored{LoRAName: s.req.LoRAName}
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
		if s.firstToken.IsZero() {
			s.firstToken = it.end
		}
		res.Tokens = append(res.Tokens, Token{RequestID: s.req.ID, Index: s.output - 1, ID: tok})
		if s.output >= s.req.MaxTokens {
			e.finish(s, it.end, res)
		}
	}
}

func (e *Engine) finish(s *seq, at time.Time, res *StepResult) {
	e.running = removeSeq(e.running, s)
	e.cache.release(s.table)
	s.table = nil
	s.state = stateDone
	delete(e.seqs, s.req.ID)
	res.Completed = append(res.Completed, Completion{
		RequestID:    s.req.ID,
		Arrival:      s.arrival,
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
