// Package localrouter is the heart of a pool's local router: the KV index
// of which worker holds which prompt blocks, the lifecycle state of the
// requests in flight on each worker, and the cost function that picks a
// worker for a request (NVIDIA Dynamo's KvRouter, in Go).
//
// # Pieces
//
//   - Index: a radix tree over local block hashes (kvevents hashing); each
//     node records which (worker, dp_rank) hold it in a bitset, so a lookup
//     intersects one machine word per block for pools of up to 64 ranks.
//     The tree holds no Go pointers (tree.go: nodes in a slab named by id,
//     children past the first in one open-addressing table), so the GC
//     does not walk it. It is fed by engine KV events (Apply), or, in
//     approximate mode, by the router's own decisions (Record, with a TTL
//     and a size bound). With events, each placed request's blocks are
//     also recorded as predicted entries on its worker (Predict,
//     predicted.go: a short TTL, confirmed
//     by the engine's Stored, never over a block the engine holds, dropped
//     by Cleared), so the next decision sees them. Each
//     cache tier of a worker (GPU, CPU, disk, external: the events'
//     medium) has its own slot, so FindMatches reports per-tier runs
//     (Matches.Tiers) and the cost credits lower-tier hits at
//     Config.TierWeights. The index also keeps the configuration guard
//     (ConfigWarning): why a worker's stores are all being skipped.
//   - ActiveSequences: per (worker, dp_rank), the prefill tokens still
//     pending and the distinct blocks of active requests, keyed by request
//     id (Add, MarkPrefillComplete, Free, forced expiry).
//   - Router: membership, the two above, and BestWorker / PotentialLoads /
//     Commit / MarkPrefillComplete / Free / DumpEvents; reservations
//     (reserve.go): a reserving BestWorker holds the chosen worker's load
//     for a request for a TTL, never in the index, until Confirm turns it
//     into the request or Release / the TTL drops it. BestWorker answers
//     a routing.Selection (api/routing; Selected gives its WorkerKey) and
//     takes a routing.Override, the types the whole request path shares;
//     WorkerKey, ScorerSpec and the error sentinels (ErrClosed,
//     ErrUnknownRequest, ...) are api/routing's too, aliased here, so the
//     client side (localrouter/client, pool, globalrouter) never links this
//     package. localrouter/inproc runs a Router in process as a pool.Client
//     (the replay's transport).
//   - Engine signals (package signals): what each rank's engine reports on
//     its metrics endpoint, handed in by SetEngineSignals. They add
//     Config.WaitingWeight and KVUsageWeight terms to the cost scorer's
//     value (0 by default: Dynamo's cost unchanged), feed the waiting and
//     kv-usage scorers, and let BestWorker skip, with a
//     reason, a rank its engine reports saturated (Config.Saturation;
//     BestWorkerOptions.Signals receives the skips).
//   - The worker chain (scorer.go): how BestWorker ranks the candidates,
//     filters (saturation, lora) then weighted scorers (ttft, cost,
//     prefix, prefill, decode, waiting, running, kv-usage, lora-affinity,
//     session, cold; scorer_builtin.go, scorer_ttft.go), built once from
//     Config.WorkerChain by the Config's ScorerRegistry
//     (scorer_registry.go: Config.Scorers, nil for BuiltinScorers; no
//     package state), from inline specs or strict YAML (scorer_yaml.go,
//     also a pool's worker_chain in the global router's pools file).
//     PoolChainCheck (poolchain.go) checks a pools file's worker chains
//     against a registry, for the process that links both. The default
//     chain is saturation then ttft; saturation then cost is Dynamo's
//     choice exactly. Selection.Cost is the ttft prediction in ms whatever
//     the chain, Selection.ChainScore the chain's own total; other chains
//     report each scorer's part in routing.Selection.Scores.
//     Config.Unread (scorer_knobs.go) names the settings the chain does
//     not read; OverrideNote and SessionNote (there too) the request's
//     override and session key it ignores, logged once. Stateful scorers (cold) keep their own mutex, a leaf.
//   - Calibration (calib.go, calib_pool.go): the ttft scorer prices each
//     rank with its own TimingModel, fitted online (least squares with
//     forgetting, Huber-bounded residuals) from the time between each
//     placement and its MarkPrefillComplete: the pool's shape times the
//     rank's speed, shrunk towards the pool's by its significance; the
//     configured curves until CalibrationMinSamples samples
//     (Config.Calibrate; Router.PinTiming sets a rank's model outright).
//     Where the engines' metrics are scraped, their time to first token
//     histograms add samples for the first tokens the lifecycle did not
//     see (calib_hist.go; the lifecycle stays primary). Router.Calibration
//     reports them.
//
// # Concurrency
//
// The Index uses a sync.RWMutex: FindMatches readers run in parallel; event
// writers apply one at a time, each event whole or not at all. The
// lifecycle state is guarded by its own mutex, held for O(request blocks).
// The Router reads its membership from an immutable snapshot through an
// atomic pointer. Lock order: Router.applyMu (event appliers vs worker
// removal), then Router.memMu (membership writers), then the Index's or
// the ActiveSequences' lock; those two are never held together.
// Router.placeMu serialises placing decisions (BestWorker with a request
// id, Commit) so each sees the ones before it; it is taken before the
// Index's and ActiveSequences' locks and never with applyMu or memMu. The
// engine signals are an immutable map behind an atomic pointer; their
// writers' mutex (sigMu) is a leaf, never held with another lock.
//
// Several Routers in one process are independent: each owns its sweeper
// goroutine and Close stops only that one.
//
// # Files
//
// index.go (Index, its slots, NewIndex, the tree's reference counts and
// Stats), index_apply.go (Apply: Stored, Removed, Cleared; RemoveWorker),
// index_match.go (FindMatches, Matches and its per-tier runs),
// index_approx.go (approximate mode: Record, Expire, the size bound),
// index_dump.go (Dump: the index as events), index_guard.go (the
// configuration guard, ConfigWarning), predicted.go (predicted entries),
// tree.go (the node slab and child table), bitset.go (the per-node worker
// sets), entrylist.go (the TTL-ordered entry lists), slots.go (slot
// tables), active.go (ActiveSequences, its ActiveObserver), refs.go (its shared block
// references), router.go (Router, Options, New, the sweeper, Close),
// router_members.go (membership: AddWorker, RemoveWorker, SetWorkerStale,
// Ready; ApplyEvent), router_signals.go (engine signals, saturation
// skips), router_best.go (Request, BestWorker, pick, PotentialLoads),
// router_lifecycle.go (Commit, MarkPrefillComplete, Free), reserve.go
// (reserving probes: BestWorkerOptions.ReserveTTL, Confirm, Release, their
// expiry and ReservationStats), config.go
// (Config, Validate, the cost formula), scorer.go (the worker chain:
// ScorerSpec, Filter, Scorer, the registry), scorer_builtin.go (the
// built-in filters and scorers), scorer_ttft.go (the ttft scorer),
// scorer_yaml.go (the chain's YAML form), calib.go (the ttft scorer's
// timing models: TimingModel, the online fit), calib_pool.go (the pool's
// shape and each rank's speed over it, samples, pins), calib_router.go
// (PinTiming, Calibration, the lifecycle's samples), calib_hist.go (the
// samples from the engines' latency histograms).
package localrouter
