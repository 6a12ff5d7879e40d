// Package sim replays request traces against simulated workers to measure
// routing quality: the real routing code (localrouter's KV index, lifecycle
// state and cost function, called in-process) decides where each request
// goes, and mocker engine cores, advanced in virtual time, serve them and
// report their KV caches back to the index through KV events, as vLLM
// workers do in production. Nothing sleeps: an hour of trace replays in
// seconds to minutes.
//
// # Pieces
//
//   - Trace loading (trace.go): Mooncake's FAST'25 JSONL format (timestamp
//     ms, input_length, output_length, hash_ids of 512-token blocks) and a
//     simple JSONL of raw prompts (text or token ids). Malformed lines are
//     reported with their line numbers, and either skipped or refused.
//   - Generated traces (agentic.go): agent sessions with shared tool
//     preambles, growing multi-turn contexts and bursts of sub-agents,
//     deterministic by seed (GenerateAgentic, ParseAgentic).
//   - Expansion (expand.go): each trace block id becomes the same tokens
//     wherever it appears, so the routers hash real token ids at any block
//     size, exactly as in production.
//   - The event loop (sim.go): one discrete-event simulation per
//     (topology, policy): arrivals, engine iterations and (optionally
//     delayed) KV event deliveries, ordered by virtual time and, at equal
//     times, by the order they were scheduled, so a run is a pure function
//     of its Config and seed.
//   - Topologies (config.go: Config, Topology; cluster.go): one flat pool; P pools behind a global
//     selection step (state-free BestWorker probes of every pool ranked by
//     the global router's policies.Cost, lowest normalised cost first); a
//     disaggregated prefill pool and decode pool.
//   - The config replay (global.go, Config.Global): a global router
//     configuration replayed through the real globalrouter.Router.Decide,
//     its chain and pool policies, over in-process local routers
//     (inproc.Client) per configured pool; the decision's lease drives the
//     lifecycle. One pool of N workers replays exactly as the flat topology.
//   - Flow control (flow.go, Config.FlowControl, --flow-control): the
//     global router's own admission queue (globalrouter/flowcontrol.Queue)
//     run in virtual time for the config replay: a request Decide refuses
//     as saturated waits, dispatched (a fresh Decide) on each prefill
//     completion or free, refused at its deadline.
//   - The tree (tree.go, "tree=RxP"): R region global routers of P pools
//     of local routers each, under a top global router whose pools are the
//     regions' in-process Subtree clients; the real Decide at every floor,
//     "pool/worker" ids mapped back to the engines, leases as above.
//   - Sweeps (sweep.go): every combination of named router parameters and
//     chain arguments, and the Pareto front of mean/p99 TTFT vs hit ratio.
//   - Policies (policy.go, ttft.go): random, round-robin, least-loaded,
//     kv-overlap, Dynamo's default cost, kvgate's default (the
//     predicted-TTFT scorer, "ttft:ext=…"), its form in Dynamo's cost
//     formula, and any cost configuration given as
//     "cost:credit=…,scale=…,temp=…".
//   - The oracles (oracle.go): the hit ratio of an infinite cache shared by
//     all workers, the physical limit of prefix reuse, and of one LRU
//     cache holding the pool's total KV capacity, what perfect routing
//     without duplication could keep.
//   - Overload (mix.go, calibrate.go): --tenant-mix spreads requests over
//     tenants in the tenancy header; each result breaks its figures down
//     by priority and by tenant (TTFT, refused requests, the share meeting
//     the priority's TTFT SLO, goodput) with Jain's fairness index over
//     the tenants; Calibrate measures the configured pools' capacity (a
//     backlog of the trace's requests at once) so that --load offers a
//     multiple of it.
//   - Reporting (report.go, plot.go with plot_svg.go and plot_png.go,
//     progress.go: the progress bar): a terminal table, JSON, and an SVG or PNG
//     with each policy's TTFT CDF and hit ratio.
//
// Run is the entry point; the kvgate replay command is a thin flag parser
// in front of it.
package sim
