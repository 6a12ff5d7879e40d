// Package globalrouter makes one routing decision per request: tokenize
// once, hash blocks once per distinct pool block size, probe every eligible
// pool's local router in parallel with the state-free BestWorker, run the
// pool policies over the probe results, commit the request to the chosen
// local router, and return a Decision (pool, worker, fallbacks, prefill
// worker, explanation). It holds no KV state.
package globalrouter
