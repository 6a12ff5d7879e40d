// Package pool is the global router's view of its pools:
// what a pool is (Config: name, role, models, block size, where its local
// routers are, its policy section), the clients to each pool's local
// routers, the state-free probes under a deadline, the commits and Track
// streams of requests placed in the pool, local-router discovery in etcd,
// health with a circuit per local router, and the workers' passive health.
//
// # Failure, not slowness
//
// A probe's deadline adapts to the router's observed probe latency
// (DeadlineFactor × its p99, within Options.ProbeMinTimeout and
// ProbeTimeout). A circuit opens on evidence of failure (CircuitOptions):
// hard failures in a row, timeouts in a row (a higher count), or a failure
// ratio over a window; a timeout whose deadline fired far later than set
// (this process was starved) counts against nothing. Its backoff doubles
// once per open period. An Ejector (passive health, fed by the response
// path) takes a worker whose connections fail out of the candidates for a
// bounded time: a probe whose best worker is ejected is answered with the
// router's best other worker (PotentialLoads). The pool keeps the workers
// its probes and a background refresh named (Others: same-pool fallbacks;
// LastKnown: the best-effort target when no router can be reached).
//
// A Client is one local router's client (GRPCDialer wraps
// localrouter/client, the project's one client of that service, with a
// unary call per probe and a Track stream per request; ChannelDialer, the
// global router's default, multiplexes both on one Channel stream per
// router): Probe, and CommitAsync, the pipelined commit. A Pool picks a router and adds
// the circuits: Pool.Probe, Pool.CommitAsync (returns once the commit is
// sent; the answer goes to a listener), Pool.Commit (waits, within the
// request's context, for the answer) and Pool.Decide (a commit without a
// worker: the router chooses within the request's subset less the ejected
// workers, waited for within the probe deadline). Answers are routing.Selection
// (api/routing), the type every floor of the request path shares; a
// Tracker's stream outlives the request's context and frees the request on
// the local router when it is freed or breaks.
//
// A pool's worker_chain (Config.WorkerChain, []routing.ScorerSpec) is
// checked for its shape by Validate; the names and arguments only the
// local router's scorer registry knows are checked by CheckWorkerChain with
// a ChainCheck the process passes in (localrouter.PoolChainCheck), since
// pool never links the local router's core. LocalDialer (localdial.go)
// dials in-process clients by name, such as localrouter/inproc's.
//
// # Concurrency and ownership
//
// A Pool is safe for concurrent use. Its list of local routers is an
// immutable snapshot read through an atomic pointer; etcd discovery replaces
// it. Connections to local routers live in a Conns shared by every Pool of a
// global router, across configuration reloads: each Pool and each open
// Tracker holds a reference, and a connection closes when the last one is
// released, so a reload never breaks the Track streams of requests in
// flight. Lock order: Conns.mu before circuit.mu; the late-commit queue's
// lock before Pool.mu; nothing else nests
// (latency, known and Ejector locks are leaves).
//
// # Files
//
// config.go (Config, Routers, DecodeConfigs), pool.go (Pool, Options,
// Open, Close, picking a router), probe.go (Probe, ProbeError, the known
// workers: Others, LastKnown; ProbeAgain, the retry with the longest
// deadline), late.go (CommitLate: a best-effort decision's commit, queued
// (LateRetargeter: made to name the worker that served it),
// bounded, and sent with its lifecycle in order once a router of the pool
// answers again), commit.go (CommitAsync, Commit, Decide, the
// tracker), health.go (Health, Routers: the circuits as policies and
// status pages see them), discovery.go (the local routers followed in
// etcd), client.go (Client, Tracker, Dialer, GRPCDialer), channel.go
// (ChannelDialer), localdial.go (LocalDialer: in-process clients by name),
// conns.go (Conns: shared, reference-counted connections), circuit.go
// (the circuit per local router), deadline.go (the adaptive probe
// deadline), eject.go (Ejector: passive health), hops.go (the hop count
// across a hierarchy, Loads).
package pool
