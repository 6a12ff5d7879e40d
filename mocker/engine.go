package mocker

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/membership"
)

// Defaults returns c with every unset field set to its default.
func (c Config) Defaults() Config { return c.withDefaults() }

// Request is one generation request as the engine sees it: token ids in,
// MaxTokens tokens out (the mocker never stops early).
type Request struct {
	ID        string
	Tokens    []uint32
	MaxTokens int
	// LoRAName selects the adapter; blocks of different adapters never
	// share cache entries.
	LoRAName string
	// CacheSalt is the request's cache_salt: as in vLLM
	// (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys at
	// vllm-project/vllm@bbf906a88ba1a39104884c88c9811a4f968e4659, the salt
	// is an extra key of the first block, so the chain of every later block
	// differs too), salted blocks never share cache entries with unsalted
	// ones or another salt's. It enters the hashes' seed
	// (kvevents.ChainSeed, Dynamo's salt hash) and the KV events
	// (Stored.CacheSalt, sent in the first block's extra_keys as vLLM does).
	CacheSalt string
	// RemotePrefill marks a request whose KV is computed by a prefill worker
	// (the x-prefiller-host-port header). Only a decode-role engine honours
	// it: instead of prefilling, the request waits ISL × KVBytesPerToken /
	// KVTransferBandwidth, then starts decoding.
	RemotePrefill bool
	// HoldBlocks marks a P/D prefill (kv_transfer_params do_remote_decode,
	// on a prefill-role engine): when it finishes, its blocks stay
	// referenced (pinned) until ReleaseHeld or Config.KVHoldTimeout, as
	// vLLM's NixlConnector delays freeing them for the decode worker to
	// read (engine_hold.go).
	HoldBlocks bool
}

// Token is one generated token.
type Token struct {
	RequestID string
	// Index is the token's position in the output, 0 for the first.
	Index int
	ID    uint32
	// Since is the time from the request's arrival (the first token: its
	// time to first token) or from its previous token (the inter-token
	// latency) to this one, as vLLM's per-iteration stats observe them.
	Since time.Duration
}

// Finish reasons of a Completion.
const (
	FinishLength = "length"
	FinishAbort  = "abort"
)

// Completion is the record of a finished request.
type Completion struct {
	RequestID string
	// Arrival is when Submit was called; Scheduled when it was first
	// scheduled (zero if never); FirstToken when the first token was
	// produced (zero if none); Finished when the last was.
	Arrival, Scheduled, FirstToken, Finished time.Time
	PromptTokens                             int
	// CachedTokens is the prompt tokens served from the prefix cache when
	// the request was first scheduled.
	CachedTokens int
	OutputTokens int
	Preemptions  int
	// Reason is FinishLength or FinishAbort.
	Reason string
	// HeldBlocks are the block ids a HoldBlocks request left pinned (nil
	// otherwise): the remote_block_ids of its kv_transfer_params.
	HeldBlocks []int
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
	// HeldBlocks are pinned for a decode worker to pull (HoldBlocks);
	// ExpiredHolds counts holds released by KVHoldTimeout, not a pull.
	HeldBlocks   int
	ExpiredHolds int64
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
	scheduled               time.Time // first scheduled (Completion.Scheduled)
	lastToken               time.Time // when the last token was produced
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
	// held are the pinned blocks of finished HoldBlocks requests, by id.
	held map[string]hold
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
		seed:      kvevents.ChainSeed(r.LoRAName, r.CacheSalt),
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
	e.expireHolds(now)
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
	if until, ok := e.nextHoldExpiry(); ok && (res.Next.IsZero() || until.Before(res.Next)) {
		res.Next = until
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
	for _, h := range e.held {
		st.HeldBlocks += len(h.table)
	}
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
