package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/signals"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

var discardLogger = slog.New(slog.DiscardHandler)

// epoch is virtual time zero. Any fixed instant works; this one reads well
// in a debugger.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// workload is the trace prepared once and shared, read-only, by every
// simulation of a Run.
type workload struct {
	reqs      []Request
	traceBS   int
	blockSize int
	seed      uint64
	// hashes are each prompt's local block hashes at blockSize (what the
	// global router computes once per request).
	hashes [][]uint64
}

func newWorkload(t *Trace, blockSize int, seed uint64) (*workload, error) {
	wl := &workload{reqs: t.Requests, traceBS: t.BlockSize, blockSize: blockSize, seed: seed, hashes: make([][]uint64, len(t.Requests))}
	var buf []uint32
	for i := range wl.reqs {
		buf = wl.reqs[i].AppendTokens(buf[:0], wl.traceBS, seed)
		h, err := kvevents.AppendLocalHashes(nil, buf, blockSize, "")
		if err != nil {
			return nil, err
		}
		wl.hashes[i] = h
	}
	return wl, nil
}

func (wl *workload) tokens(idx int) []uint32 {
	return wl.reqs[idx].AppendTokens(make([]uint32, 0, wl.reqs[idx].InputLength), wl.traceBS, wl.seed)
}

// Run simulates every (topology, policy) pair of cfg on its trace and
// returns the report. It fails on an invalid config or if ctx ends.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	var capacity *Capacity
	if cfg.Load > 0 {
		var err error
		if capacity, err = Calibrate(ctx, cfg); err != nil {
			return nil, err
		}
		cfg.Rate = capacity.rateFor(cfg.Load)
	}
	trace := cfg.Trace.Scale(cfg.Rate, cfg.MaxRequests)
	wl, err := newWorkload(trace, cfg.BlockSize, cfg.Seed)
	if err != nil {
		return nil, err
	}
	rep := newReport(cfg, wl)
	rep.Engines = cfg.engineReport()
	rep.Bounds.CausalCapacityOracleHitRatio = causalCapacityOracleHitRatio(wl, rep.Workers*(cfg.KVTokens/cfg.BlockSize), cfg.MaxNumBatchedTokens, cfg.fastestTiming())
	rep.Load, rep.Capacity = cfg.Load, capacity
	// The table breaks results down by priority and tenant when asked to
	// (a mix, a load or targets); the JSON always does.
	rep.classes = cfg.Load > 0 || cfg.SLOMS != nil || (cfg.Global != nil && (len(cfg.Global.Priorities) > 0 || len(cfg.Global.Tenants) > 0))
	slo, err := cfg.sloTargets(rep.UnloadedTTFTMS.P99)
	if err != nil {
		return nil, err
	}
	cfg.SLOMS = slo
	type job struct {
		topo   Topology
		policy Policy
	}
	var jobs []job
	for _, t := range cfg.Topologies {
		for _, p := range cfg.Policies {
			jobs = append(jobs, job{t, p})
		}
	}
	prog := newProgress(cfg.Progress, len(jobs)*len(wl.reqs))
	defer prog.finish()
	results := make([]*Result, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, cfg.Parallel)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i], errs[i] = simulate(ctx, cfg, wl, j.topo, j.policy, prog)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	rep.Results = results
	for _, r := range results {
		r.HitVsOracle = ratio(r.HitRatio, rep.OracleHitRatio)
		r.HitVsCapacityOracle = ratio(r.HitRatio, rep.CapacityOracleHitRatio)
	}
	rep.Replay.WallSeconds = time.Since(start).Seconds()
	rep.Replay.SimulatedRequests = len(jobs) * len(wl.reqs)
	if rep.Replay.WallSeconds > 0 {
		rep.Replay.RequestsPerWallSecond = float64(rep.Replay.SimulatedRequests) / rep.Replay.WallSeconds
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.Replay.HeapSysBytes = ms.HeapSys
	rep.Replay.PeakRSSBytes = peakRSS()
	return rep, nil
}

// record is what happened to one request.
type record struct {
	arrival, first, finish time.Time
	prompt, cached, output int
	preemptions            int
	worker                 int // the worker that prefilled it
	done, rejected         bool
	// priority and tenant are what the request carried (x-kvgate-priority,
	// the tenancy header: --priority-mix, --tenant-mix); 0 and "" without.
	priority int
	tenant   string
}

// event kinds of the simulation queue.
const (
	evArrival = iota
	evWake
	evKV
	evFlow    // a flow-control deadline (flow.go)
	evScrape  // sample the engines' metrics (scrape.go)
	evSignals // a scrape reaches the routers (scrape.go)
)

type event struct {
	t    time.Time
	seq  uint64 // scheduling order: ties at equal t go first-scheduled first
	kind int
	idx  int
	w    *worker
	evs  []kvevents.Event
	// samples are an evSignals' engine samples, by worker index.
	samples []signals.Sample
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].t.Equal(q[j].t) {
		return q[i].t.Before(q[j].t)
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// run is one simulation: one topology, one policy, its own routers, engines
// and random sources.
type run struct {
	cfg    Config
	wl     *workload
	topo   Topology
	policy Policy

	now        time.Time
	q          eventQueue
	seq        uint64
	pools      []*simPool
	workers    []*worker
	recs       []record
	rng        *rand.Rand // the simulation's own choices (random, ties)
	routerRand *rand.Rand // the local routers' tie-breaking
	rr         int
	prog       *progress
	// poolChain is the global router's pool selection for cost policies
	// across several pools.
	poolChain *policies.Chain

	eventsRejected int
	// scrapeQueued counts evScrape and evSignals events in q: scrapes go
	// on while anything else is queued (scrape.go).
	scrapeQueued int
	// llmd is the llm-d baseline's approximate prefix index (llmd.go).
	llmd *llmdIndex

	// vnow is now in unix nanoseconds, for the clocks of the routers
	// (read from the global router's probe goroutines).
	vnow atomic.Int64

	// The config replay (TopologyConfig, global.go): the global router,
	// its clients of the pools' routers, each request's lease and, when
	// disaggregated, its decode worker.
	gr           *globalrouter.Router
	clients      map[string]pool.Client
	byPool       map[string]*simPool
	leases       []globalrouter.Lease
	decodeOf     []*worker
	models       []Share
	decideErrors map[string]int
	// regions are TopologyTree's region routers (tree.go), under gr.
	regions []*globalrouter.Router
	// tenantHeader names the tenant of --tenant-mix requests (mix.go);
	// salts are the cache_salt each decision asked the engine for.
	tenantHeader string
	salts        map[int]string
	// flow is the config replay's flow control (flow.go; nil: off).
	flow *flowReplay
}

// clock is the simulation's virtual now, safe to read from any goroutine.
func (r *run) clock() time.Time { return time.Unix(0, r.vnow.Load()) }

func (r *run) setNow(t time.Time) {
	r.now = t
	r.vnow.Store(t.UnixNano())
}

// newRand is a random source of the run's seed and stream.
func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

func simulate(ctx context.Context, cfg Config, wl *workload, topo Topology, policy Policy, prog *progress) (*Result, error) {
	r := &run{
		cfg: cfg, wl: wl, topo: topo, policy: policy,
		now:        epoch,
		recs:       make([]record, len(wl.reqs)),
		rng:        rand.New(rand.NewPCG(cfg.Seed, 1)),
		routerRand: rand.New(rand.NewPCG(cfg.Seed, 2)),
		prog:       prog,
	}
	r.setNow(epoch)
	build := r.buildPools
	switch topo.Kind {
	case TopologyConfig:
		build = r.buildGlobal
	case TopologyTree:
		build = r.buildTree
	}
	err := build()
	defer func() {
		r.closeGlobal()
		for _, p := range r.pools {
			p.router.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	for i, req := range wl.reqs {
		r.push(event{t: epoch.Add(req.Arrival), kind: evArrival, idx: i})
	}
	r.startScrapes()
	for n := 0; r.q.Len() > 0; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		e := heap.Pop(&r.q).(event)
		r.setNow(e.t)
		var err error
		switch e.kind {
		case evArrival:
			if r.gr != nil {
				err = r.arriveGlobal(ctx, e.idx)
			} else {
				err = r.arrive(ctx, e.idx)
			}
		case evWake:
			if !e.w.wake.Equal(e.t) {
				continue // superseded
			}
			e.w.wake = time.Time{}
			err = r.step(ctx, e.w)
		case evKV:
			r.apply(e.w, e.evs)
		case evScrape:
			r.scrape()
		case evSignals:
			r.delivered(e.samples)
		}
		if err == nil {
			err = r.flowAfter(ctx) // expiries, dispatches (flow.go)
		}
		if err != nil {
			return nil, fmt.Errorf("%s/%s at %v: %w", topo.Name(), policy.Name, r.now.Sub(epoch), err)
		}
	}
	for i := range r.recs {
		if !r.recs[i].done && !r.recs[i].rejected {
			return nil, fmt.Errorf("%s/%s: request on line %d never finished", topo.Name(), policy.Name, wl.reqs[i].Line)
		}
	}
	if r.gr != nil {
		// Every lease ended: nothing may stay on the local routers.
		for _, p := range r.pools {
			n := 0
			p.router.Active().Loads(func(localrouter.WorkerKey, localrouter.WorkerLoad) { n++ })
			if n > 0 {
				return nil, fmt.Errorf("%s: %d workers of pool %q still have requests on their router after the replay", topo.Name(), n, p.name)
			}
		}
	}
	return r.result(), nil
}

func (r *run) push(e event) {
	e.seq = r.seq
	r.seq++
	heap.Push(&r.q, e)
}

func requestID(idx int) string { return "r" + strconv.Itoa(idx) }

func requestIndex(id string) int {
	i, err := strconv.Atoi(id[1:])
	if err != nil {
		panic("sim: foreign request id " + id)
	}
	return i
}

// routerRequest is what the global router hands a local router: the block
// hashes it computed once (or the tokens, for a prompt shorter than a block).
func (r *run) routerRequest(idx int) localrouter.Request {
	req := r.wl.reqs[idx]
	if h := r.wl.hashes[idx]; len(h) > 0 {
		return localrouter.Request{LocalHashes: h, BlockSize: r.wl.blockSize, ISL: req.InputLength}
	}
	return localrouter.Request{Tokens: r.wl.tokens(idx)}
}

func (r *run) arrive(ctx context.Context, idx int) error {
	req := r.wl.reqs[idx]
	rec := &r.recs[idx]
	rec.arrival, rec.prompt = r.now, req.InputLength
	id := requestID(idx)
	w, err := r.choose(ctx, r.candidates(false), idx, id)
	if err != nil {
		return err
	}
	rec.worker = w.index
	return r.submit(ctx, w, idx, mocker.Request{ID: id, Tokens: r.wl.tokens(idx), MaxTokens: req.OutputLength})
}

// submit hands a routed request to its worker's engine and starts the
// engine if it was idle. A request that can never fit is rejected and
// freed on the router.
func (r *run) submit(ctx context.Context, w *worker, idx int, req mocker.Request) error {
	if err := w.eng.Submit(r.now, req); err != nil {
		if !errors.Is(err, mocker.ErrTooLong) {
			return err
		}
		if r.gr != nil {
			if err := r.leases[idx].Free(ctx); err != nil {
				return err
			}
		} else {
			_ = w.pool.router.Free(ctx, req.ID)
		}
		r.recs[idx].rejected = true
		r.prog.add(1)
		return nil
	}
	return r.step(ctx, w)
}

// step advances w's engine to now and passes on what it produced: KV events
// to the router's index, prefill completions and frees to the router's
// lifecycle state, finished prefills to the decode pool.
func (r *run) step(ctx context.Context, w *worker) error {
	res := w.eng.Step(r.now)
	if len(res.Events) > 0 {
		if r.cfg.EventDelay > 0 {
			r.push(event{t: r.now.Add(r.cfg.EventDelay), kind: evKV, w: w, evs: res.Events})
		} else {
			r.apply(w, res.Events)
		}
	}
	rt := w.pool.router
	for _, tk := range res.Tokens {
		if tk.Index != 0 {
			continue
		}
		w.ttft.Sum += tk.Since.Seconds() // the engine's histogram (scrape.go)
		w.ttft.Count++
		var err error
		switch {
		case r.gr == nil:
			err = rt.MarkPrefillComplete(ctx, tk.RequestID)
		case w.pool.role != membership.RolePrefill:
			// The client's first token: the lease marks the decode (or
			// aggregated) worker's prefill done and frees the prefill
			// worker's part, as the ext_proc server does.
			err = r.leases[requestIndex(tk.RequestID)].PrefillComplete(ctx)
		}
		if err != nil {
			return err
		}
	}
	for _, c := range res.Completed {
		var err error
		switch {
		case r.gr == nil:
			err = rt.Free(ctx, c.RequestID)
		case w.pool.role != membership.RolePrefill:
			err = r.leases[requestIndex(c.RequestID)].Free(ctx)
		}
		if err != nil {
			return err
		}
		if err := r.complete(ctx, w, c); err != nil {
			return err
		}
	}
	switch {
	case res.Next.IsZero():
		w.wake = time.Time{}
	case !res.Next.Equal(w.wake):
		w.wake = res.Next
		r.push(event{t: res.Next, kind: evWake, w: w})
	}
	return nil
}

func (r *run) complete(ctx context.Context, w *worker, c mocker.Completion) error {
	idx := requestIndex(c.RequestID)
	rec := &r.recs[idx]
	rec.preemptions += c.Preemptions
	switch w.pool.role {
	case membership.RolePrefill:
		// The prompt's KV is computed: hand the request to the decode pool,
		// which receives the KV and produces the tokens the client sees.
		rec.cached = c.CachedTokens
		var dw *worker
		if r.gr != nil {
			dw = r.decodeOf[idx] // the decision paired it
		} else {
			var err error
			if dw, err = r.choose(ctx, r.candidates(true), idx, c.RequestID); err != nil {
				return err
			}
		}
		return r.submit(ctx, dw, idx, mocker.Request{
			ID: c.RequestID, Tokens: r.wl.tokens(idx), MaxTokens: r.wl.reqs[idx].OutputLength, RemotePrefill: true,
			CacheSalt: r.salts[idx],
		})
	case membership.RoleAggregated:
		rec.cached = c.CachedTokens
	case membership.RoleDecode:
		if r.gr != nil && r.decodeOf[idx] == nil {
			// A config replay's decode worker that prefilled locally (the
			// chain did not pair a prefill worker): its cache served it.
			rec.cached = c.CachedTokens
		}
	}
	rec.first, rec.finish, rec.output = c.FirstToken, c.Finished, c.OutputTokens
	rec.done = true
	r.prog.add(1)
	return nil
}

// apply feeds a worker's KV events to its pool's router, stamped with the
// worker's event ids as a publisher would.
func (r *run) apply(w *worker, evs []kvevents.Event) {
	for _, ev := range evs {
		w.eventID++
		if err := w.pool.router.ApplyEvent(kvevents.RouterEvent{WorkerID: w.key.ID, EventID: w.eventID, Event: ev}); err != nil {
			r.eventsRejected++
		}
	}
}
