// Package globalrouter makes one routing decision per request: tokenize
// once, hash blocks once per distinct pool block size, probe every eligible
// pool's local router in parallel with the state-free BestWorker, run the
// pool policies over the probe results, commit the request to the chosen
// local router, and return a Decision (pool, worker, fallbacks, prefill
// worker, explanation). It holds no KV state.
//
// The commit is pipelined: sent on the request's Track stream, not waited
// for, so a decision costs one round trip to the local routers (the
// probe). A commit that cannot be sent moves on to the next-ranked pool; one
// the local router refuses afterwards leaves the request on the probed
// worker, unaccounted there, and is counted
// (kvgate_globalrouter_refused_commits_total), logged, and returned by the
// lease's PrefillComplete as ErrCommitRefused (docs/perf-decision.md). A
// pinned worker's commit is still waited for: its answer gives the address.
//
// Router implements Decider. Build it with New from a Config (LoadConfig
// reads one from YAML, e.g. examples/pools.yaml; DefaultConfig and pool.New
// build one in Go) and Options (logger, Prometheus registerer, etcd client
// for discovered pools, policy registry, tokenizers). Decide is safe for
// concurrent use and lock-free on the configuration: it reads an immutable
// state through an atomic pointer; Reload, ReloadFile and WatchFile build a
// new state and swap it in, refusing a bad configuration and keeping the
// current one. Leases outlive reloads (their local-router connections are
// reference-counted, package pool).
//
// Error mapping (the ext_proc server translates): ErrBadRequest (no model,
// no prompt, a malformed x-kvgate-* header), ErrUnknownModel (no pool serves
// the model), ErrPinRefused (x-kvgate-pool / x-kvgate-worker-id cannot be
// honoured), ErrSaturated (a policy shed the request), ErrNoPool (no pool
// answered, the chain left none, or every ranked pool's commit failed to
// send); ErrCommitRefused (from Lease.PrefillComplete, see above).
// Policies and the request headers they read are described in
// docs/policies.md.
package globalrouter
