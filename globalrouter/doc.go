// Package globalrouter makes one routing decision per request: tokenize
// once, hash blocks once per distinct pool block size, probe every eligible
// pool's local router in parallel with the state-free BestWorker, run the
// pool policies over the probe results, commit the request to the chosen
// local router, and return a Decision (pool, worker, fallbacks, prefill
// worker, explanation). It holds no KV state.
//
// How the chosen pool records the request is probe.commit (commit.go).
// decide, the default: a decide-and-commit (pool.Pool.Decide), the local
// router choosing and recording the worker in one call within the
// request's subset less the ejected workers, waited for within the probe
// deadline; its answer is the Primary, so a burst that probed the same
// idle state spreads by capacity. A commit whose answer is costlier than
// its probe is contended: it is placed again, serialised per Router with
// the other contended commits, then rechecked once against the runner-up
// pool (kvgate_globalrouter_contended_commits_total); uncontended commits
// take no lock. pipelined: the probed worker's
// commit is sent on the request's stream, not waited for (one round trip
// less); a refusal afterwards leaves the request on the probed worker,
// unaccounted there, and is counted
// (kvgate_globalrouter_refused_commits_total), logged, and returned by the
// lease's PrefillComplete as ErrCommitRefused. reserve (reserve.go): every
// probe reserves its worker for the request on its local router
// (ProbeConfig.ReserveTTL), so later probes see the load and a burst
// spreads as with decide; the chosen pool's reservation is confirmed by a
// pipelined commit of the probed worker (no second placement, not waited
// for, unanswered where the local router takes it), the others are
// released, and one nobody confirms expires. Over several pools, a
// decision whose probes met other requests' reservations is contended:
// it releases its own and probes again under the recheck lock; the
// others take no lock. A pinned worker's commit is always waited for: its
// answer gives the address.
//
// Router implements Decider. Build it with New from a Config (LoadConfig
// reads one from YAML, e.g. examples/pools.yaml; DefaultConfig and
// pool.NewConfig build one in Go) and Options (logger, Prometheus
// registerer, etcd client for discovered pools, policy registry,
// tokenizers). Validating a configuration builds its policy chain; that
// chain is the one the Router runs (built once per configuration).
//
// Decide is safe for concurrent use and takes no lock: it loads the
// current state (one configuration, built, immutable) through an atomic
// pointer and holds a reference on it (an atomic count) for the decision.
// Reload, ReloadFile and WatchFile build a new state and swap it in,
// refusing a bad configuration and keeping the current one; the old state
// is retired once its last decision drops its reference, then its pools
// close. Leases outlive reloads (their local-router connections are
// reference-counted, package pool).
//
// Per request, Decide parses and validates the x-kvgate-* headers first (a
// malformed one costs no tokenizing or hashing), then tokenizes and hashes,
// probes, ranks and commits. The worker a pool's local router chose is one
// type all the way: routing.Selection (package api/routing) is the probe's
// answer, the policies' Candidate.Probe and the Decision's
// Endpoint.Selection; endpoint turns it into an Endpoint, in one place.
//
// Files: router.go (Router, New, Decide, Close, Health), options.go
// (Option, Tokenizer; WithLogger, WithRegisterer, WithEtcd, WithDialer,
// WithPolicies, WithClock, WithTokenizer), state.go (build, refcount,
// retire), reload.go (Reload, WatchFile),
// watchfiles.go (what WatchFile looks at), shadow.go (shadow mode: a
// candidate chain ranking alongside the live one, never committing),
// observe.go (WithObserver, WithFreeObserver, LastReload: what a status
// page and a benchmark read),
// tracing.go (OpenTelemetry spans and exemplars, WithTracerProvider),
// headers.go (request headers), decide.go (prepare, probe, rank, the
// cause of no pool), accounting.go (the one retry of a probe that reached
// no router, the best-effort decision and its late commit), blockkeys.go (a request's block keys: the
// ids, seeded by adapter and cache_salt, with the chat's media items as
// the engines' extra_keys), reserve.go (probe.commit: reserve: releasing
// the reservations no commit confirmed), commit.go (commit, fallbacks,
// lease, error mapping), pin.go (a pinned worker's decision and its
// refusals), trust.go (trust, tenancy),
// identity.go (where the tenant comes from: the tenant header, the client
// certificate Envoy forwards in x-forwarded-client-cert, a verified JWT
// claim, derived once per decision from the configuration snapshot the
// decision holds; SGLang's extra_key refused when salting), explain.go (what
// each pool's probe answered and why the winner won),
// epp.go (the endpoint-picker protocol: Request.Subset bounds every
// endpoint of a decision, probes send it as allowed_addresses; a lease is
// a Mover, so the request follows the fallback that served it; Ready),
// subtree.go (Subtree: the router answering a parent's probe for its whole
// subtree, loops refused; served over gRPC by globalrouter/subtree;
// docs/hierarchy.md), subtree_commit.go (its commits, forwarded by
// pool-qualified worker id), subtree_dial.go (SubtreeDialer: a child
// router as a parent's pool), config.go (Config, ProbeConfig,
// ModelConfig), unread.go (Config.Unread: the fields set that no policy
// of the chains reads, warned about where the file is loaded),
// unreadhdr.go (Config.UnreadHeaders: the request headers only some
// policies or flow control read, listed per configuration; pinned
// requests and a subtree's session keys too: a request carrying one the running
// configuration does not read gets a note in its explanation, a count in
// kvgate_globalrouter_unread_headers_total and a warning logged once per
// header per configuration), types.go (Request, Decision, Endpoint, Lease, the
// errors), headernames.go (the x-kvgate-* header names), metrics.go
// (the decision, probe, commit and ejection metrics),
// probers.go (the bounded probe goroutines), flow.go (flow control:
// Decide waits in the queue of its pools while they are all saturated,
// package flowcontrol; FlowQueues, FlowRequest), objective.go (the
// Inference Extension's objective header, x-gateway-inference-objective:
// the priority of a configured InferenceObjective, flow_control.objectives
// and objectives_file; trust.objectives says who may name one, default
// anyone, as the endpoint picker), workerchain.go
// (CheckWorkerChains: the pools' worker chains checked against a local
// router's scorer registry, by the process that links one; Validate checks
// their shape only).
//
// Trust (trust.go, TrustConfig): the headers that steer routing (pins,
// priority, SLO targets, cost overrides) are honoured for the callers
// trust.steering allows (default: trusted ones, a token in trust.header
// whose SHA-256 is listed), and the routing headers go back to the callers
// trust.routing_headers allows (Decision.Expose; default nobody: they are
// an oracle of what the cache holds). Pins run the chain's filters like any
// request; a pinned target they drop is refused, never re-routed.
// TenancyConfig salts each tenant's block hashes with its own seed, and
// the decision names that salt for the engine's cache_salt
// (Decision.CacheSalt); the tenant header is believed from trusted
// callers only (tenancy.identity trusted), otherwise the request is
// refused; identity xfcc and jwt-claim derive it from the client
// certificate or JWT a trusted Envoy vouches for (identity.go). The
// tenant is a field of the prepared request, read by the salting and, as
// policies.Request.Tenant, by the policies: the headers are not rewritten.
//
// Failure (pool package for the circuits): when no eligible pool's local
// router can be reached, after one retry of the probe with the longest
// deadline, the decision is made best effort on the last known workers
// (Decision.BestEffort), and its commit is queued until a router of that
// pool answers again (pool.Pool.CommitLate; accounting.go); fallbacks include other
// workers of the primary's pool; HealthReporter takes the response path's
// connection failures and ejects the worker (passive health).
//
// Error mapping (the ext_proc server translates): ErrBadRequest (no model,
// no prompt, a malformed x-kvgate-* header), ErrUnknownModel (no pool serves
// the model), ErrPinRefused (x-kvgate-pool / x-kvgate-worker-id cannot be
// honoured: unknown, wrong model), ErrForbidden (a steering header from an
// untrusted caller, or a pinned target a policy filters out), ErrSaturated
// (a policy shed the request), ErrNoPool (no pool answered and none is
// known, the chain left none, or every ranked pool's commit failed to
// send; a pinned target that is unreachable or ejected);
// ErrNoEndpointInSubset (the request's subset is empty or names no
// eligible worker); ErrCommitRefused (from Lease.PrefillComplete, see
// above). Most come as a *Refusal, whose Public message (ClientMessage)
// names the cause without internal addresses, with the dropped-reason and
// a retry-after.
// Policies and the request headers they read are described in
// docs/policies.md.
package globalrouter
