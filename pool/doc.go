// Package pool is the global router's view of its pools (DESIGN.md §2, §5):
// what a pool is (Config: name, role, models, block size, where its local
// routers are, its policy section), the clients to each pool's local
// routers, the state-free probes under a deadline, the commits and Track
// streams of requests placed in the pool, local-router discovery in etcd,
// and health with a circuit per local router.
//
// A Client is one local router's client (GRPCDialer wraps
// localrouter/client, the project's one client of that service): Probe,
// and CommitAsync, the pipelined commit. A Pool picks a router and adds
// the circuits: Pool.Probe, Pool.CommitAsync (returns once the commit is
// sent; the answer goes to a listener) and Pool.Commit (waits, within the
// request's context, for the answer). Answers are routing.Selection
// (api/routing), the type every floor of the request path shares; a
// Tracker's stream outlives the request's context and frees the request on
// the local router when it is freed or breaks.
//
// # Concurrency and ownership
//
// A Pool is safe for concurrent use. Its list of local routers is an
// immutable snapshot read through an atomic pointer; etcd discovery replaces
// it. Connections to local routers live in a Conns shared by every Pool of a
// global router, across configuration reloads: each Pool and each open
// Tracker holds a reference, and a connection closes when the last one is
// released, so a reload never breaks the Track streams of requests in
// flight. Lock order: Conns.mu before circuit.mu; nothing else nests.
package pool
