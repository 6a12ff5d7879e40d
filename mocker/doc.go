// Package mocker is a simulated vLLM-like inference engine: a paged KV cache
// with prefix reuse, a continuous-batching scheduler and a GPU timing model,
// behind vLLM's OpenAI-compatible HTTP API, publishing KV events like a real
// engine. It stands in for vLLM in demos, end-to-end tests and the trace
// simulator, so routing quality measured on it means something.
//
// # The engine core (no HTTP, no goroutines, no clock)
//
// Engine is a discrete-event model. It never reads a clock and never sleeps:
// the caller owns time and passes it in. The HTTP server drives one Engine
// with the wall clock; the trace simulator (sim/) drives many with a virtual
// clock, as fast as the CPU allows.
//
//	eng, err := mocker.NewEngine(mocker.Config{BlockSize: 16, NumBlocks: 4096})
//	err = eng.Submit(now, mocker.Request{ID: "r1", Tokens: prompt, MaxTokens: 64})
//	res := eng.Step(now)           // starts an iteration if the engine was idle
//	for !res.Next.IsZero() {       // until idle
//		res = eng.Step(res.Next)   // a simulator may Submit more in between
//		feed(res.Events)           // KV events → a router's index
//		for _, c := range res.Completed { record(c.TTFT()) }
//	}
//
// The protocol:
//
//   - Submit(now, req) queues a request that arrives at now. It returns
//     ErrBadRequest (empty id or prompt, MaxTokens ≤ 0, duplicate id) or
//     ErrTooLong (prompt + MaxTokens exceeds the whole cache). Submitting
//     does not start work: call Step(now) after it.
//   - Step(now) advances the engine to now. Each iteration in flight whose
//     end is ≤ now is completed (its tokens, completions and KV events are
//     stamped with its end time), and the next iteration starts at once at
//     that end time if there is work (continuous batching: iterations run
//     back to back). An idle engine starts at the arrival time of the first
//     schedulable request, so calling Step late never shifts virtual time.
//     StepResult.Next is when to call Step again: the end of the iteration in
//     flight, or when a decode-role KV transfer completes; zero means idle
//     until the next Submit. Calling Step earlier than Next is harmless.
//   - Results: StepResult.Tokens (Index 0 = first token = prefill complete,
//     what a router's lifecycle tracking calls PREFILL_COMPLETE),
//     StepResult.Completed (Completion: Arrival, FirstToken, Finished,
//     TTFT(), PromptTokens, CachedTokens, OutputTokens, Preemptions), and
//     StepResult.Events.
//   - KV events: StepResult.Events lists kvevents.Event values (Stored
//     chains with token ids and a parent hash, Removed) in the order the
//     cache changed. Engine hashes are kvgate's own chained sequence hashes
//     (kvevents.SequenceHashes over LocalHashes with the request's LoRA
//     and cache_salt seed, kvevents.ChainSeed), so a consumer may key on them directly. Applying every GPU
//     event (Medium "") in order to an empty set yields exactly
//     Engine.CachedBlocks(); with a CPU tier (Config.CPUBlocks) the events
//     of medium CPU describe it the same way. To get
//     RouterEvents, stamp a worker id, dp rank and event id (or hand them to
//     kvevents.Publisher).
//   - Abort(id) drops a request (a client went away); its blocks stay
//     cached. ResetPrefixCache() forgets every cached block when none is in
//     use (a Cleared event). Stats() snapshots the gauges and counters
//     (running, waiting, KV usage, prefix queries and hits, preemptions,
//     evictions); CachedBlocks() is the cache's content.
//
// # The live engine
//
// Server wraps one Engine for real time: a single goroutine (Server.Run)
// steps it at the times it asks for, with a Clock (RealClock), streams
// tokens to HTTP handlers and hands each step's KV events to a KVSink:
// ZMQSink (vLLM's wire format, for `kvgate relay`), PublisherSink (NATS via
// kvevents.Publisher) or FuncSink. The process around it (listener, sink,
// TLS, etcd self-registration) is internal/mockerd's.
//
// An Engine is not safe for concurrent use; the HTTP server serialises
// access with a mutex.
//
// With ServerConfig.DPSize > 1 a Server runs one Engine per data-parallel
// rank (each its own cache, scheduler, goroutine and KV sink, events
// tagged with the rank) and routes each request to the rank its
// X-Data-Parallel-Rank header or routed_dp_rank body field names, else to
// the least loaded; X-Mocker-Dp-Rank in the response names the rank that
// served it. /metrics carries vLLM's names with its model_name and engine
// labels, one series per rank. In ZMQ mode each rank has its own PUB
// socket at the endpoint's port + rank, as vLLM binds them.
//
// # What the model does
//
// The cache is vLLM v1's block pool: NumBlocks blocks of BlockSize tokens,
// refcounted; full blocks are registered under their sequence hash, and a
// new request reuses the longest registered prefix of its prompt (at least
// one token is always computed). Freed blocks keep their contents and join
// the tail of a free queue; allocation takes the head and evicts what it
// held (a Removed event). Output tokens fill blocks too and are cached.
//
// With Config.CPUBlocks, a block evicted from the GPU is first offloaded to
// a CPU tier of that many blocks (a Stored of medium CPU naming the block
// by engine hash, as vLLM's offloading connector does, before the GPU's
// Removed); the tier evicts least recently used (Removed, medium CPU). A
// waiting request's prefix that continues on the CPU tier is reloaded, not
// computed: the iteration takes t × KVBytesPerToken / CPUReloadBandwidth
// longer for t reloaded tokens, instead of their prefill.
//
// The scheduler is vLLM v1's: each iteration first serves running sequences
// (one decode token each, or the next chunk of a chunked prefill), then
// admits waiting ones in arrival order while the token budget
// (MaxNumBatchedTokens), the sequence limit (MaxNumSeqs) and free blocks
// allow. When a running sequence needs a block and none is free, the most
// recently admitted sequence is preempted: its blocks are released and it is
// recomputed later (recomputation reuses whatever is still cached).
//
// An iteration's duration comes from Timing, by default Dynamo's mocker's
// model: prefill ms = 4.21e-7·t² + 0.01518·t + 16.5 over the t uncached
// prompt tokens computed, plus decode ms = −25.74p² + 54.01p + 5.74 at KV
// usage p when any sequence decodes, divided by Config.Speedup.
//
// Roles: aggregated; prefill (every request stops after its first token,
// its KV left cached for a decode worker; with HoldBlocks its blocks stay
// pinned until ReleaseHeld or KVHoldTimeout); decode (a request with
// RemotePrefill waits ISL × KVBytesPerToken / KVTransferBandwidth for its
// KV, which then lands in the cache as if computed, and starts decoding).
// Over HTTP the two roles speak vLLM's P/D protocol (pd.go): a prefill
// worker answers kv_transfer_params as NixlConnector does, a decode worker
// given x-prefiller-host-port makes llm-d's sidecar hop to it, then pulls
// the pinned blocks (PathKVRead) before decoding.
//
// # Text
//
// The HTTP layer turns text into tokens with a Tokenizer. The built-in
// WordTokenizer is deterministic and needs no files; inject a real one
// (tokenizer/) through ServerConfig.Tokenizer for exact token counts. Chat
// bodies are parsed whole by tokenizer.ParseChat; a ChatTokenizer (such as
// *tokenizer.Model) renders them with its model's chat template, exactly
// as a router configured with the same tokenizer does, so both hash the
// same blocks; a plain Tokenizer encodes RenderChat's text.
//
// # Files
//
// engine.go (Engine, Request, Completion, StepResult, Stats; Submit,
// Abort, Step), engine_config.go (Config, its defaults, Validate),
// engine_schedule.go (the scheduler: admission, chunked prefill,
// preemption, block registration, finishing), engine_hold.go (a P/D
// prefill's pinned blocks: hold, release, expiry), kvcache.go (the block pool
// and its free queue, the CPU tier), timing.go (Timing, DefaultTiming),
// timing_curves.go (Curves: the timing model as data, ParseCurves for a
// replay's --engine-timing file),
// tokenizer.go (Tokenizer, WordTokenizer, RenderChat), runner.go (Clock,
// KVSink, the goroutine stepping one rank's Engine), observe.go
// (RequestObserver: a rank's admissions and departures, for benchmarks), sink.go (ZMQSink,
// PublisherSink, FuncSink), metrics.go (vLLM's Prometheus metrics),
// server.go (Server, ServerConfig, NewServer, Run, stats,
// ConfigureHTTPServer), model.go (Server.Model: the model name the
// server serves and its process registers),
// server_wire.go (the OpenAI and vLLM wire types, body limits, error
// responses), server_parse.go (reading and validating a completion or
// chat request, tokenizing its prompt), server_generate.go (running a
// request on a rank: streamed and whole responses, the rank choice),
// server_info.go (/v1/models, /tokenize), pd.go (the P/D protocol:
// kv_transfer_params, the sidecar's prefill hop, the KV pull and its
// side channel, their metrics), responses.go (OpenAI's Responses API,
// /v1/responses), messages.go (Anthropic's Messages API, /v1/messages),
// apis.go (what those two share: admitting a generation, the chat form
// of their bodies, the mocker's deterministic tool calls, named SSE
// events), models.go (/v1/models/{id}, and each client's shape:
// Anthropic's for a request with anthropic-version).
package mocker
