package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/inproc"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// TopologyConfig is the global router's configuration replayed as it is
// deployed (Config.Global): its pools, each behind its own in-process
// local router, and the real globalrouter.Router.Decide in front.
const TopologyConfig = "config"

// GlobalReplay replays a global router configuration: every request goes
// through globalrouter.Router.Decide (the configured chain: model match,
// priority, SLO grid, disaggregation, weights, ...), which probes and
// commits on in-process local routers (inproc.Client, over the local dialer),
// one per pool of the configuration, serving simulated engines in virtual
// time. What is deployed is what is measured.
//
// The configuration is replayed as loaded, except what has no meaning in
// virtual time or in a replay: each pool's routers become its in-process
// router (pool.LocalAddress(name)); probe deadlines become an hour (the
// in-process answer is immediate; a deadline would measure the machine
// running the replay, not the system replayed); steering headers are
// honoured for every caller (the replayed requests are the operator's own:
// --priority-mix sets x-kvgate-priority); the shadow chain is left out.
type GlobalReplay struct {
	// Config is the global router's configuration (globalrouter.LoadConfig).
	Config *globalrouter.Config
	// Name labels the topology in the report: "config:<Name>".
	Name string
	// Label labels the policy column ("chain" when empty).
	Label string
	// PoolWorkers sets the workers of pools by name; the pools it does not
	// name share Config.Workers' remainder evenly (the first ones get one
	// more when it does not divide).
	PoolWorkers map[string]int
	// Models spreads the requests over models by weight (default: the
	// configuration's first model: its models section's first, else the
	// first pool's first model that is not "*").
	Models []Share
	// Priorities spreads the requests over x-kvgate-priority values by
	// weight (default: no header).
	Priorities []Share
	// Tenants spreads the requests over tenants by weight (a=4,b=1: a
	// offers four times b's load), named in the configuration's
	// tenancy.header, or DefaultTenantHeader when it has none (default:
	// no tenant). Like priorities, the tenant header is believed from
	// every caller in a replay (tenancy.identity on).
	Tenants []Share
	// Router adjusts a pool's local-router configuration (nil: none).
	// Each pool starts from localrouter.DefaultConfig with the pool's
	// block size, its worker_chain and Config.PredictedTTL.
	Router func(poolName string, c *localrouter.Config)
	// Client, when set, makes the pool.Client the global router reaches a
	// pool's local router through (default inproc.New(r, address)): the
	// seam for pools that are themselves routers of a subtree.
	Client func(poolName string, r *localrouter.Router, address func(localrouter.WorkerKey) string) pool.Client
	// Policies are the pool policies Config's chain may name (nil: the
	// built-ins; the registry Config was loaded with).
	Policies *policies.Registry
}

// Share is one value of a mix and its weight.
type Share struct {
	Value  string
	Weight float64
}

// ParseShares parses "a=0.7,b=0.3" (weights positive; they need not sum to
// 1); what names the flag in errors.
func ParseShares(what, s string) ([]Share, error) {
	var out []Share
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		v, w, ok := strings.Cut(part, "=")
		v = strings.TrimSpace(v)
		f, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
		switch {
		case !ok || v == "":
			return nil, fmt.Errorf("%w: %s: %q is not value=weight", ErrConfig, what, part)
		case err != nil || !(f > 0) || math.IsInf(f, 0):
			return nil, fmt.Errorf("%w: %s: %q: weight %q is not a positive number", ErrConfig, what, part, w)
		case seen[v]:
			return nil, fmt.Errorf("%w: %s: %q listed twice", ErrConfig, what, v)
		}
		seen[v] = true
		out = append(out, Share{Value: v, Weight: f})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s: empty", ErrConfig, what)
	}
	return out, nil
}

// ParsePoolWorkers parses "name=N,..." (N ≥ 1).
func ParsePoolWorkers(s string) (map[string]int, error) {
	out := map[string]int{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, n, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		k, err := strconv.Atoi(strings.TrimSpace(n))
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("%w: pool workers: %q is not name=count", ErrConfig, part)
		case err != nil || k < 1:
			return nil, fmt.Errorf("%w: pool workers: %q: %q is not a positive count", ErrConfig, part, n)
		case out[name] != 0:
			return nil, fmt.Errorf("%w: pool workers: pool %q listed twice", ErrConfig, name)
		}
		out[name] = k
	}
	return out, nil
}

func (g *GlobalReplay) label() string {
	if g.Label == "" {
		return "chain"
	}
	return g.Label
}

// defaultModel is the model of requests when no mix is given.
func (g *GlobalReplay) defaultModel() string {
	if len(g.Config.Models) > 0 {
		return g.Config.Models[0].Name
	}
	for _, p := range g.Config.Pools {
		for _, m := range p.Models {
			if m != "*" {
				return m
			}
		}
	}
	return "model"
}

// poolWorkers returns each pool's worker count, in the configuration's
// order.
func (g *GlobalReplay) poolWorkers(total int) ([]int, error) {
	pools := g.Config.Pools
	for name := range g.PoolWorkers {
		if !slices.ContainsFunc(pools, func(p pool.Config) bool { return p.Name == name }) {
			return nil, fmt.Errorf("%w: pool workers: the configuration has no pool %q", ErrConfig, name)
		}
	}
	out := make([]int, len(pools))
	rest, free := total, 0
	for i, p := range pools {
		if n, ok := g.PoolWorkers[p.Name]; ok {
			out[i] = n
			rest -= n
		} else {
			free++
		}
	}
	if free == 0 {
		return out, nil
	}
	if rest < free {
		return nil, fmt.Errorf("%w: %d workers left for %d pools without a count (pool workers)", ErrConfig, max(rest, 0), free)
	}
	k := 0
	for i, p := range pools {
		if _, ok := g.PoolWorkers[p.Name]; ok {
			continue
		}
		out[i] = rest / free
		if k < rest%free {
			out[i]++
		}
		k++
	}
	return out, nil
}

func (g *GlobalReplay) validate(workers int) error {
	if g.Config == nil {
		return fmt.Errorf("%w: config replay without a configuration", ErrConfig)
	}
	if len(g.Config.Pools) == 0 {
		return fmt.Errorf("%w: %s: no pools", ErrConfig, g.Name)
	}
	if _, err := g.poolWorkers(workers); err != nil {
		return err
	}
	for _, s := range g.Priorities {
		if _, err := strconv.Atoi(s.Value); err != nil {
			return fmt.Errorf("%w: priority mix: %q is not an integer priority", ErrConfig, s.Value)
		}
	}
	return nil
}

// totalWorkers is the workers of every pool.
func (g *GlobalReplay) totalWorkers(workers int) int {
	ns, err := g.poolWorkers(workers)
	if err != nil {
		return workers
	}
	n := 0
	for _, k := range ns {
		n += k
	}
	return n
}

// noTokenizer stands in for the models' tokenizers: replayed requests
// carry token ids, so nothing is tokenized (and no tokenizer file is
// needed to replay a configuration).
type noTokenizer struct{}

var errNoTokenizer = errors.New("the replay sends token ids; no tokenizer")

func (noTokenizer) Encode(string) ([]uint32, error) { return nil, errNoTokenizer }
func (noTokenizer) EncodeChat(*tokenizer.ChatRequest) ([]uint32, error) {
	return nil, errNoTokenizer
}

// buildGlobal makes the configuration's pools (a local router and engines
// each) and the global router in front of them.
func (r *run) buildGlobal() error {
	g, cfg := r.cfg.Global, r.cfg
	counts, err := g.poolWorkers(cfg.Workers)
	if err != nil {
		return err
	}
	clients := make(map[string]pool.Client, len(g.Config.Pools))
	gcfg := *g.Config
	gcfg.Pools = slices.Clone(g.Config.Pools)
	for i := range gcfg.Pools {
		pc := &gcfg.Pools[i]
		pc.Defaults()
		rc := Policy{}.routerConfig(pc.BlockSize, cfg.PredictedTTL)
		rc.OverlapScoreCredit, rc.PrefillLoadScale, rc.RouterTemperature = 1, 1, 0
		rc.WorkerChain = pc.WorkerChain // empty: the default chain
		if g.Router != nil {
			g.Router(pc.Name, &rc)
		}
		rt, err := localrouter.New(rc, localrouter.Options{
			Clock:         r.clock,
			Rand:          newRand(cfg.Seed, routerStream(i)),
			Logger:        discardLogger,
			SweepInterval: -1,
		})
		if err != nil {
			return fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		role := pc.Role
		if role == "" {
			role = membership.RoleAggregated
		}
		p := &simPool{name: pc.Name, role: role, router: rt, byKey: make(map[localrouter.WorkerKey]*worker)}
		r.pools = append(r.pools, p)
		for range counts[i] {
			w := &worker{index: len(r.workers), pool: p, busy: new(time.Duration)}
			w.key = localrouter.WorkerKey{ID: fmt.Sprintf("w%d", w.index)}
			w.eng, err = mocker.NewEngine(mocker.Config{
				BlockSize:           pc.BlockSize,
				NumBlocks:           cfg.KVTokens / pc.BlockSize,
				CPUBlocks:           cfg.CPUKVTokens / pc.BlockSize,
				MaxNumSeqs:          cfg.MaxNumSeqs,
				MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
				Role:                role,
				Timing:              cfg.engineTiming(w.index, w.busy),
				Speedup:             cfg.workerSpeedup(w.index),
			})
			if err != nil {
				return fmt.Errorf("pool %q: %w", pc.Name, err)
			}
			rt.AddWorker(w.key.ID, 1)
			p.workers = append(p.workers, w)
			p.byKey[w.key] = w
			r.workers = append(r.workers, w)
		}
		address := workerAddress(pc.Name)
		if g.Client != nil {
			clients[pc.Name] = g.Client(pc.Name, rt, address)
		} else {
			clients[pc.Name] = inproc.New(rt, address)
		}
		pc.Routers = pool.Routers{Static: []string{pool.LocalAddress(pc.Name)}}
	}
	r.clients = clients
	r.byPool = make(map[string]*simPool, len(r.pools))
	for _, p := range r.pools {
		r.byPool[p.name] = p
	}
	gcfg.Probe.Timeout, gcfg.Probe.MinTimeout = time.Hour, time.Hour
	gcfg.Trust.Steering = globalrouter.AccessOn
	gcfg.Shadow = nil
	if len(g.Tenants) > 0 {
		if gcfg.Tenancy.Header == "" {
			gcfg.Tenancy.Header = DefaultTenantHeader
		}
		gcfg.Tenancy.Identity = globalrouter.IdentityOn
		r.tenantHeader = strings.ToLower(gcfg.Tenancy.Header)
	}
	if cfg.FlowControl {
		gcfg.FlowControl = flowConfig(gcfg.FlowControl)
		r.flow = &flowReplay{qs: map[string]*flowcontrol.Queue{}}
	}
	opts := []globalrouter.Option{
		globalrouter.WithoutFlowQueue(), // the replay runs it in virtual time (flow.go)
		globalrouter.WithDialer(pool.LocalDialer(clients)),
		globalrouter.WithClock(r.clock),
		globalrouter.WithRegisterer(prometheus.NewRegistry()),
		globalrouter.WithLogger(discardLogger),
	}
	if g.Policies != nil {
		opts = append(opts, globalrouter.WithPolicies(g.Policies))
	}
	models := map[string]bool{"*": true}
	for _, pc := range gcfg.Pools {
		for _, m := range pc.Models {
			if !models[m] {
				models[m] = true
				opts = append(opts, globalrouter.WithTokenizer(m, noTokenizer{}))
			}
		}
	}
	opts = append(opts, globalrouter.WithTokenizer("*", noTokenizer{}))
	if r.gr, err = globalrouter.New(gcfg, opts...); err != nil {
		return err
	}
	r.models = g.Models
	if len(r.models) == 0 {
		r.models = []Share{{Value: g.defaultModel(), Weight: 1}}
	}
	r.leases = make([]globalrouter.Lease, len(r.wl.reqs))
	r.decodeOf = make([]*worker, len(r.wl.reqs))
	r.decideErrors = map[string]int{}
	return nil
}

// routerStream is the random stream of pool i's router: the first pool
// draws the flat replay's (stream 2), so one pool of N workers behind the
// global router replays exactly as the flat topology does; each other pool
// draws its own (the global router probes pools concurrently).
func routerStream(i int) uint64 {
	if i == 0 {
		return 2
	}
	return 100 + uint64(i)
}

// workerAddress is the host:port of a simulated worker of pool name.
func workerAddress(name string) func(localrouter.WorkerKey) string {
	return func(k localrouter.WorkerKey) string { return k.ID + "." + name + ":8000" }
}

// closeGlobal stops the global router, then a tree's region routers, then
// the clients.
func (r *run) closeGlobal() {
	if r.gr != nil {
		_ = r.gr.Close()
	}
	for _, g := range r.regions {
		_ = g.Close()
	}
	for _, c := range r.clients {
		_ = c.Close()
	}
}

// mixKey identifies a request's prompt prefix: requests sharing their
// first block (a conversation, a shared preamble) draw the same model and
// priority, as the requests of one application do.
func (r *run) mixKey(idx int) uint64 {
	req := r.wl.reqs[idx]
	h := splitmix(r.cfg.Seed ^ 0x6d6978)
	switch {
	case len(req.HashIDs) > 0:
		h = splitmix(h ^ req.HashIDs[0])
	case len(req.Tokens) > 0:
		for _, t := range req.Tokens[:min(len(req.Tokens), 16)] {
			h = splitmix(h ^ uint64(t))
		}
	default:
		h = splitmix(h ^ uint64(idx))
	}
	return h
}

// pickShare picks a share by u, a uniform 64-bit value.
func pickShare(shares []Share, u uint64) string {
	var sum float64
	for _, s := range shares {
		sum += s.Weight
	}
	x := float64(u>>11) / (1 << 53) * sum
	for _, s := range shares {
		x -= s.Weight
		if x < 0 {
			return s.Value
		}
	}
	return shares[len(shares)-1].Value
}

// arriveGlobal routes request idx with the global router's Decide.
func (r *run) arriveGlobal(ctx context.Context, idx int) error {
	req := r.wl.reqs[idx]
	rec := &r.recs[idx]
	rec.arrival, rec.prompt = r.now, req.InputLength
	id := requestID(idx)
	key := r.mixKey(idx)
	greq := &globalrouter.Request{ID: id, Path: "/v1/completions", Model: pickShare(r.models, key),
		PromptTokens: r.wl.tokens(idx), Headers: map[string]string{}}
	if r.cfg.Global != nil && len(r.cfg.Global.Priorities) > 0 {
		v := pickShare(r.cfg.Global.Priorities, splitmix(key))
		greq.Headers[globalrouter.HeaderPriority] = v
		rec.priority, _ = strconv.Atoi(v) // validated
	}
	if slo, ok := r.cfg.SLOMS[rec.priority]; ok && r.flow != nil {
		// Under flow control the client states the TTFT target its class
		// is judged by (--slo-ms, or the default), as x-kvgate-ttft-ms:
		// the queue bounds its wait by it (docs/flow-control.md). Only
		// with --flow-control, so that no other replay changes (the slo
		// policies read the header too).
		greq.Headers[globalrouter.HeaderTTFT] = strconv.FormatInt(int64(math.Ceil(slo)), 10)
	}
	if r.tenantHeader != "" {
		// Its own stream of the prefix's key: a tenant is one
		// application's requests, independent of their priority.
		rec.tenant = pickShare(r.cfg.Global.Tenants, splitmix(key^0x74656e616e74))
		greq.Headers[r.tenantHeader] = rec.tenant
	}
	if r.flowWaiting(greq) {
		return r.flowEnqueue(idx, greq, 0) // others wait: it joins them
	}
	d, err := r.gr.Decide(ctx, greq)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if r.flow != nil && errors.Is(err, globalrouter.ErrSaturated) {
			return r.flowEnqueue(idx, greq, globalrouter.FlowNeed(err))
		}
		rec.rejected = true
		r.decideErrors[decideErrorKind(err)]++
		r.prog.add(1)
		return nil
	}
	return r.placeGlobal(ctx, idx, greq, d)
}

// placeGlobal sends request idx where decision d says.
func (r *run) placeGlobal(ctx context.Context, idx int, greq *globalrouter.Request, d *globalrouter.Decision) error {
	rec := &r.recs[idx]
	r.leases[idx] = d.Lease
	if r.flow != nil {
		r.leases[idx] = flowLease{Lease: d.Lease, f: r.flow}
	}
	primary, err := r.endpointWorker(d.Primary)
	if err != nil {
		return err
	}
	first := primary
	if d.Prefill != nil {
		if first, err = r.endpointWorker(*d.Prefill); err != nil {
			return err
		}
		r.decodeOf[idx] = primary
	}
	rec.worker = first.index
	if d.CacheSalt != "" {
		// The engine hashes with the salt the router did (tenancy.salt).
		if r.salts == nil {
			r.salts = map[int]string{}
		}
		r.salts[idx] = d.CacheSalt
	}
	return r.submit(ctx, first, idx, mocker.Request{ID: greq.ID, Tokens: greq.PromptTokens, MaxTokens: r.wl.reqs[idx].OutputLength, CacheSalt: d.CacheSalt})
}

// endpointWorker is the simulated worker of a decision's endpoint.
// In a tree (TopologyTree) the endpoint's pool is a region and its worker
// id "leaf-pool/worker".
func (r *run) endpointWorker(e globalrouter.Endpoint) (*worker, error) {
	name, id := e.Pool, e.WorkerID
	if r.topo.Kind == TopologyTree {
		var err error
		if name, id, err = r.treeEndpoint(e); err != nil {
			return nil, err
		}
	}
	p := r.byPool[name]
	if p == nil {
		return nil, fmt.Errorf("decision names pool %q, which the replay lacks", name)
	}
	w := p.byKey[localrouter.WorkerKey{ID: id, DPRank: e.DPRank}]
	if w == nil {
		return nil, fmt.Errorf("decision names worker %s/%d of pool %q, which the replay lacks", id, e.DPRank, name)
	}
	return w, nil
}

// decideErrorKind names why Decide refused a request, for the report.
func decideErrorKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{globalrouter.ErrSaturated, "saturated"},
		{globalrouter.ErrNoPool, "no_pool"},
		{globalrouter.ErrUnknownModel, "unknown_model"},
		{globalrouter.ErrForbidden, "forbidden"},
		{globalrouter.ErrBadRequest, "bad_request"},
		{globalrouter.ErrPinRefused, "pin_refused"},
		{globalrouter.ErrBodyTooLarge, "body_too_large"},
		{policies.ErrSaturated, "saturated"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}
