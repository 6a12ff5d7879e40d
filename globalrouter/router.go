package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// Request headers the global router reads (keys lower-case).
const (
	// HeaderPool pins the request to a pool; refused (ErrPinRefused) when
	// that pool cannot take it.
	HeaderPool = "x-kvgate-pool"
	// HeaderWorkerID pins the request to a worker (with HeaderDPRank, default
	// rank 0), in HeaderPool when set, else in any pool serving the model.
	HeaderWorkerID = "x-kvgate-worker-id"
	HeaderDPRank   = "x-kvgate-dp-rank"
	// HeaderSession is the session key policies see.
	HeaderSession = "x-kvgate-session-id"
	// HeaderPriority is the request's priority (an integer; higher first).
	HeaderPriority = "x-kvgate-priority"
	// HeaderTTFT and HeaderITL are the request's latency targets in ms.
	HeaderTTFT = "x-kvgate-ttft-ms"
	HeaderITL  = "x-kvgate-itl-ms"
	// Per-request overrides of the local routers' cost parameters.
	HeaderOverlapScoreCredit = "x-kvgate-overlap-score-credit"
	HeaderPrefillLoadScale   = "x-kvgate-prefill-load-scale"
	HeaderRouterTemperature  = "x-kvgate-router-temperature"
)

// syncTimeout bounds how long New and Reload wait for etcd discovery's
// first listing.
const syncTimeout = 5 * time.Second

// Tokenizer is what the global router needs of a model's tokenizer;
// *tokenizer.Model implements it. Safe for concurrent use.
type Tokenizer interface {
	Encode(text string) ([]uint32, error)
	EncodeChat(messages []tokenizer.Message, addGenerationPrompt bool) ([]uint32, error)
}

// Option configures a Router.
type Option func(*options)

type options struct {
	logger     *slog.Logger
	registerer prometheus.Registerer
	etcd       *clientv3.Client
	dialer     pool.Dialer
	registry   *policies.Registry
	now        func() time.Time
	tokenizers map[string]Tokenizer
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegisterer registers the kvgate_globalrouter_* metrics on reg
// (default: a private registry, nothing exported).
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithEtcd gives the etcd client that pools with routers.etcd discover
// their local routers with.
func WithEtcd(cli *clientv3.Client) Option { return func(o *options) { o.etcd = cli } }

// WithDialer replaces the gRPC dialer of local routers (default
// pool.GRPCDialer()).
func WithDialer(d pool.Dialer) Option { return func(o *options) { o.dialer = d } }

// WithPolicies sets the policy registry (default: the built-ins).
func WithPolicies(reg *policies.Registry) Option { return func(o *options) { o.registry = reg } }

// WithClock sets the clock of latencies and circuits (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithTokenizer uses t for model instead of loading the configured one.
func WithTokenizer(model string, t Tokenizer) Option {
	return func(o *options) {
		if o.tokenizers == nil {
			o.tokenizers = map[string]Tokenizer{}
		}
		o.tokenizers[model] = t
	}
}

// Router is the global router: it implements Decider over the configured
// pools. Safe for concurrent use. Decide reads the current configuration
// (an immutable state) through an atomic pointer; Reload builds a new state
// and swaps it in, then retires the old one once the decisions using it
// are done.
type Router struct {
	opts  options
	log   *slog.Logger
	m     *metrics
	conns *pool.Conns

	reloadMu sync.Mutex // serialises Reload and Close
	st       atomic.Pointer[state]
}

var _ Decider = (*Router)(nil)

// New builds a Router from cfg (defaults applied, validated) and opts. It
// returns once the pools that discover their local routers in etcd have
// their first listing (at most 5 s).
func New(cfg Config, opts ...Option) (*Router, error) {
	o := options{}
	for _, f := range opts {
		f(&o)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.registerer == nil {
		o.registerer = prometheus.NewRegistry()
	}
	if o.dialer == nil {
		o.dialer = pool.GRPCDialer()
	}
	if o.now == nil {
		o.now = time.Now
	}
	o.registry = builtins(o.registry)
	m, err := newMetrics(o.registerer)
	if err != nil {
		return nil, fmt.Errorf("globalrouter: metrics: %w", err)
	}
	cfg.Defaults()
	if err := cfg.Validate(o.registry); err != nil {
		return nil, err
	}
	r := &Router{opts: o, m: m, log: o.logger.With("component", "globalrouter"),
		conns: pool.NewConns(o.dialer, pool.CircuitOptions{Base: cfg.Probe.BackoffBase, Max: cfg.Probe.BackoffMax}, o.now)}
	st, err := r.build(&cfg, nil)
	if err != nil {
		_ = r.conns.Close()
		return nil, err
	}
	r.st.Store(st)
	r.log.Info("global router configured", "pools", len(st.pools), "models", len(st.models), "chain", chainNames(st.chain), "file", cfg.File)
	return r, nil
}

// state is one configuration, built: immutable but for retirement.
type state struct {
	cfg    *Config
	chain  *policies.Chain
	pools  []*poolEntry // configuration order
	byName map[string]*poolEntry
	models map[string]*modelEntry
	// wildcard serves models no pool names, when a pool serves "*".
	wildcard *modelEntry

	// mu: decisions hold it for reading; retire takes it to wait for them.
	mu      sync.RWMutex
	retired bool
}

type poolEntry struct {
	p   *pool.Pool
	cfg pool.Config
}

type modelEntry struct {
	name       string
	lora       string // adapter name when the model is a LoRA adapter
	tok        Tokenizer
	tcfg       tokenizer.Config
	pools      []*poolEntry
	blockSizes []int // distinct, in order of first use
}

func (r *Router) build(cfg *Config, old *state) (_ *state, err error) {
	chain, err := cfg.buildChain(r.opts.registry)
	if err != nil {
		return nil, err
	}
	st := &state{cfg: cfg, chain: chain, byName: map[string]*poolEntry{}, models: map[string]*modelEntry{}}
	defer func() {
		if err != nil {
			for _, pe := range st.pools {
				pe.p.Close()
			}
		}
	}()
	for _, pc := range cfg.Pools {
		p, err := pool.Open(pc, pool.Options{Conns: r.conns, ProbeTimeout: cfg.Probe.Timeout, Etcd: r.opts.etcd, Logger: r.opts.logger})
		if err != nil {
			return nil, err
		}
		pe := &poolEntry{p: p, cfg: pc}
		st.pools = append(st.pools, pe)
		st.byName[pc.Name] = pe
	}
	// Pools discovering their routers in etcd get their first listing
	// before the state serves: a reload must not blink to "no router".
	deadline := time.NewTimer(syncTimeout)
	defer deadline.Stop()
	timedOut := false
	for _, pe := range st.pools {
		if timedOut {
			deadline.Reset(0)
		}
		select {
		case <-pe.p.Synced():
		case <-deadline.C:
			timedOut = true
			r.log.Warn("local router discovery has not listed yet; the pool has no router until it does", "pool", pe.cfg.Name)
		}
	}
	var wild []*poolEntry
	for _, pe := range st.pools {
		if pe.cfg.Serves("*") {
			wild = append(wild, pe)
		}
	}
	entry := func(model string) (*modelEntry, error) {
		me := &modelEntry{name: model, tcfg: cfg.tokenizerFor(model), lora: cfg.loraOf(model)}
		if t, ok := r.opts.tokenizers[model]; ok {
			me.tok = t
		} else if prev := old.model(model); prev != nil && sameTokenizer(prev.tcfg, me.tcfg) {
			me.tok = prev.tok
		} else {
			tc := me.tcfg
			tc.Logger = r.opts.logger
			t, err := tokenizer.Load(tc)
			if err != nil {
				return nil, fmt.Errorf("%s: model %q: tokenizer: %w", cfg.file(), model, err)
			}
			me.tok = t
		}
		for _, pe := range st.pools {
			if pe.cfg.Serves(model) {
				me.pools = append(me.pools, pe)
				if !containsInt(me.blockSizes, pe.cfg.BlockSize) {
					me.blockSizes = append(me.blockSizes, pe.cfg.BlockSize)
				}
			}
		}
		return me, nil
	}
	for _, pe := range st.pools {
		for _, m := range pe.cfg.Models {
			if m == "*" || st.models[m] != nil {
				continue
			}
			me, err := entry(m)
			if err != nil {
				return nil, err
			}
			st.models[m] = me
		}
	}
	if len(wild) > 0 {
		me, err := entry("*")
		if err != nil {
			return nil, err
		}
		st.wildcard = me
	}
	return st, nil
}

func (st *state) model(name string) *modelEntry {
	if st == nil {
		return nil
	}
	if me := st.models[name]; me != nil {
		return me
	}
	return st.wildcard
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func chainNames(c *policies.Chain) []string {
	var out []string
	for _, p := range c.Policies() {
		out = append(out, p.Name())
	}
	return out
}

// acquire returns the current state, held for reading.
func (r *Router) acquire() *state {
	for {
		st := r.st.Load()
		if st == nil {
			return nil
		}
		st.mu.RLock()
		if !st.retired {
			return st
		}
		st.mu.RUnlock()
	}
}

// retire waits for the decisions using st and closes its pools. Leases
// keep their own references to the local routers' clients.
func (st *state) retire() {
	st.mu.Lock()
	st.retired = true
	st.mu.Unlock()
	for _, pe := range st.pools {
		pe.p.Close()
	}
}

// Reload replaces the configuration with cfg. A configuration that does not
// validate or build (bad policy arguments, a tokenizer that does not load)
// is refused and the current one stays.
func (r *Router) Reload(cfg Config) error {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	old := r.st.Load()
	if old == nil {
		return errors.New("globalrouter: closed")
	}
	cfg.Defaults()
	err := cfg.Validate(r.opts.registry)
	var st *state
	if err == nil {
		st, err = r.build(&cfg, old)
	}
	if err != nil {
		r.m.reloads.WithLabelValues("refused").Inc()
		r.log.Error("configuration refused; keeping the current one", "file", cfg.File, "err", err)
		return err
	}
	r.conns.SetCircuitOptions(pool.CircuitOptions{Base: cfg.Probe.BackoffBase, Max: cfg.Probe.BackoffMax})
	r.st.Store(st)
	old.retire()
	r.m.reloads.WithLabelValues("ok").Inc()
	r.log.Info("configuration reloaded", "file", cfg.File, "pools", len(st.pools), "chain", chainNames(st.chain))
	return nil
}

// ReloadFile reads path and reloads it (see Reload).
func (r *Router) ReloadFile(path string) error {
	cfg, err := LoadConfig(path, r.opts.registry)
	if err != nil {
		r.m.reloads.WithLabelValues("refused").Inc()
		r.log.Error("configuration refused; keeping the current one", "file", path, "err", err)
		return err
	}
	return r.Reload(*cfg)
}

// Config returns the current configuration.
func (r *Router) Config() Config {
	st := r.st.Load()
	if st == nil {
		return Config{}
	}
	return *st.cfg
}

// PoolHealth is one pool's health, for status pages.
type PoolHealth struct {
	Pool    string
	Role    policies.Role
	Health  policies.Health
	Routers []pool.RouterStatus
}

// Health reports every pool's health.
func (r *Router) Health() []PoolHealth {
	st := r.acquire()
	if st == nil {
		return nil
	}
	defer st.mu.RUnlock()
	out := make([]PoolHealth, len(st.pools))
	for i, pe := range st.pools {
		out[i] = PoolHealth{Pool: pe.cfg.Name, Role: pe.cfg.Role, Health: pe.p.Health(), Routers: pe.p.Routers()}
	}
	return out
}

// Close stops the router: pools, discovery and every local-router client
// (open leases break, which frees their requests on the local routers).
func (r *Router) Close() error {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	if st := r.st.Swap(nil); st != nil {
		st.retire()
	}
	return r.conns.Close()
}

// probeResult is one pool's probe.
type probeResult struct {
	pe  *poolEntry
	sel pool.Selection
	err error
	dur time.Duration
}

// Decide implements Decider.
func (r *Router) Decide(ctx context.Context, req *Request) (*Decision, error) {
	start := r.opts.now()
	d, err := r.decide(ctx, req)
	outcome, poolName := "ok", ""
	if err != nil {
		outcome = errOutcome(err)
	} else {
		poolName = d.Primary.Pool
	}
	r.m.decision.WithLabelValues(outcome).Observe(r.opts.now().Sub(start).Seconds())
	r.m.decisions.WithLabelValues(poolName, outcome).Inc()
	return d, err
}

func errOutcome(err error) string {
	switch {
	case errors.Is(err, ErrBadRequest):
		return "bad_request"
	case errors.Is(err, ErrUnknownModel):
		return "unknown_model"
	case errors.Is(err, ErrPinRefused):
		return "pin_refused"
	case errors.Is(err, ErrSaturated):
		return "saturated"
	case errors.Is(err, ErrNoPool):
		return "no_pool"
	}
	return "error"
}

// prepared is a request tokenized and hashed.
type prepared struct {
	req    *Request
	me     *modelEntry
	tokens []uint32
	// hashes[i] are the local hashes at me.blockSizes[i].
	hashes   [][]uint64
	view     policies.Request
	override *pool.Override
	id       string
}

func (p *prepared) prompt(blockSize int) pool.Prompt {
	pr := pool.Prompt{BlockSize: blockSize, ISL: len(p.tokens), Override: p.override, LoRA: p.me.lora}
	for i, bs := range p.me.blockSizes {
		if bs == blockSize {
			pr.Hashes = p.hashes[i]
		}
	}
	if len(pr.Hashes) == 0 {
		pr.Tokens = p.tokens
	}
	return pr
}

func (r *Router) decide(ctx context.Context, req *Request) (*Decision, error) {
	if req == nil || req.Model == "" {
		return nil, fmt.Errorf("%w: the request names no model", ErrBadRequest)
	}
	st := r.acquire()
	if st == nil {
		return nil, fmt.Errorf("%w: the global router is closed", ErrNoPool)
	}
	defer st.mu.RUnlock()
	me := st.model(req.Model)
	if me == nil {
		return nil, fmt.Errorf("%w: no pool serves model %q", ErrUnknownModel, req.Model)
	}
	pinPool, pinWorker := req.Headers[HeaderPool], req.Headers[HeaderWorkerID]
	eligible := me.pools
	if pinPool != "" {
		pe := st.byName[pinPool]
		switch {
		case pe == nil:
			return nil, fmt.Errorf("%w: %s: no pool %q", ErrPinRefused, HeaderPool, pinPool)
		case !pe.cfg.Serves(req.Model):
			return nil, fmt.Errorf("%w: %s: pool %q does not serve model %q", ErrPinRefused, HeaderPool, pinPool, req.Model)
		}
		eligible = []*poolEntry{pe}
	}
	p, err := r.prepare(req, me)
	if err != nil {
		return nil, err
	}
	if pinWorker != "" {
		return r.decidePinnedWorker(ctx, st, p, eligible, pinWorker)
	}
	results := r.probe(ctx, p, eligible)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cands := make([]policies.Candidate, 0, len(results))
	var failed, saturated int
	for _, res := range results {
		if res.err != nil {
			failed++
			if status.Code(res.err) == codes.ResourceExhausted {
				saturated++
			}
			continue
		}
		cands = append(cands, candidate(res, len(p.tokens)))
	}
	if len(cands) == 0 {
		switch {
		case pinPool != "":
			return nil, pinError(HeaderPool, pinPool, results[0].err)
		case saturated == failed && failed > 0:
			return nil, fmt.Errorf("%w: %w", ErrSaturated, errors.Join(errs(results)...))
		}
		return nil, fmt.Errorf("%w: %w", ErrNoPool, errors.Join(errs(results)...))
	}
	var trace *policies.Trace
	if req.Explain || r.log.Enabled(ctx, slog.LevelDebug) {
		trace = &policies.Trace{}
	}
	ranked, err := st.chain.Rank(&p.view, cands, trace)
	if err != nil {
		if errors.Is(err, policies.ErrSaturated) {
			return nil, fmt.Errorf("%w: %w", ErrSaturated, err)
		}
		if pinPool != "" {
			return nil, fmt.Errorf("%w: %s: pool %q: %w", ErrPinRefused, HeaderPool, pinPool, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrNoPool, err)
	}
	return r.commit(ctx, st, p, results, ranked, trace, pinPool != "")
}

func errs(results []probeResult) []error {
	var out []error
	for _, r := range results {
		if r.err != nil {
			out = append(out, r.err)
		}
	}
	return out
}

func candidate(res probeResult, isl int) policies.Candidate {
	s := res.sel
	bs := s.BlockSize
	if bs == 0 {
		bs = res.pe.cfg.BlockSize
	}
	return policies.Candidate{
		Pool: res.pe.cfg.Name, Role: res.pe.cfg.Role, Models: res.pe.cfg.Models, Weight: res.pe.cfg.Weight,
		Health: res.pe.p.Health(),
		Probe: policies.Probe{
			WorkerID: s.WorkerID, DPRank: s.DPRank, Address: s.Address,
			OverlapBlocks: s.OverlapBlocks, RequestBlocks: s.RequestBlocks, BlockSize: bs,
			UncachedTokens: max(0, isl-s.OverlapBlocks*bs),
			PrefillTokens:  s.PrefillTokens, DecodeBlocks: s.DecodeBlocks, Cost: s.Cost, Workers: s.Workers,
		},
	}
}

// prepare tokenizes the request once and hashes it once per distinct block
// size of the model's pools.
func (r *Router) prepare(req *Request, me *modelEntry) (*prepared, error) {
	p := &prepared{req: req, me: me, id: req.ID}
	if p.id == "" {
		p.id = fmt.Sprintf("kvgate-%016x", rand.Uint64())
	}
	t0 := r.opts.now()
	var err error
	switch {
	case len(req.Messages) > 0:
		msgs := make([]tokenizer.Message, len(req.Messages))
		for i, m := range req.Messages {
			msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		p.tokens, err = me.tok.EncodeChat(msgs, true)
	case len(req.PromptTokens) > 0:
		p.tokens = req.PromptTokens
	case req.Prompt != "":
		p.tokens, err = me.tok.Encode(req.Prompt)
	default:
		return nil, fmt.Errorf("%w: the request has no prompt or messages", ErrBadRequest)
	}
	r.m.tokenize.Observe(r.opts.now().Sub(t0).Seconds())
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return nil, fmt.Errorf("%w: model %q: %w", ErrBadRequest, req.Model, err)
		}
		return nil, fmt.Errorf("tokenize for model %q: %w", req.Model, err)
	}
	if len(p.tokens) == 0 {
		return nil, fmt.Errorf("%w: the prompt is empty", ErrBadRequest)
	}
	p.hashes = make([][]uint64, len(me.blockSizes))
	for i, bs := range me.blockSizes {
		if p.hashes[i], err = kvevents.LocalHashes(p.tokens, bs, me.lora); err != nil {
			return nil, fmt.Errorf("hash blocks of %d tokens: %w", bs, err)
		}
	}
	if p.view, p.override, err = view(req, p.id, len(p.tokens)); err != nil {
		return nil, err
	}
	return p, nil
}

// finite reports whether x is neither NaN nor ±Inf (ParseFloat accepts
// both, and a NaN cost orders nothing).
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// view builds the policies' view of the request and the cost overrides
// from its headers.
func view(req *Request, id string, isl int) (policies.Request, *pool.Override, error) {
	v := policies.Request{ID: id, Model: req.Model, ISL: isl, Headers: req.Headers, SessionKey: req.Headers[HeaderSession]}
	h := req.Headers
	var err error
	if s := h[HeaderPriority]; s != "" {
		if v.Priority, err = strconv.Atoi(s); err != nil {
			return v, nil, fmt.Errorf("%w: %s: %q is not an integer", ErrBadRequest, HeaderPriority, s)
		}
	}
	for _, d := range []struct {
		name string
		out  *time.Duration
	}{{HeaderTTFT, &v.SLO.TTFT}, {HeaderITL, &v.SLO.ITL}} {
		if s := h[d.name]; s != "" {
			ms, err := strconv.ParseFloat(s, 64)
			if err != nil || !finite(ms) || ms < 0 || ms > 1e9 { // up to ~11 days
				return v, nil, fmt.Errorf("%w: %s: %q is not a duration in milliseconds", ErrBadRequest, d.name, s)
			}
			*d.out = time.Duration(ms * float64(time.Millisecond))
		}
	}
	var o *pool.Override
	for _, f := range []struct {
		name string
		set  func(*pool.Override, *float64)
	}{
		{HeaderOverlapScoreCredit, func(o *pool.Override, v *float64) { o.OverlapScoreCredit = v }},
		{HeaderPrefillLoadScale, func(o *pool.Override, v *float64) { o.PrefillLoadScale = v }},
		{HeaderRouterTemperature, func(o *pool.Override, v *float64) { o.RouterTemperature = v }},
	} {
		if s := h[f.name]; s != "" {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil || !finite(x) || x < 0 {
				return v, nil, fmt.Errorf("%w: %s: %q is not a non-negative number", ErrBadRequest, f.name, s)
			}
			if o == nil {
				o = &pool.Override{}
			}
			f.set(o, &x)
		}
	}
	return v, o, nil
}

// probe asks every eligible pool in parallel; each probe is bounded by the
// pool's probe timeout.
func (r *Router) probe(ctx context.Context, p *prepared, eligible []*poolEntry) []probeResult {
	results := make([]probeResult, len(eligible))
	one := func(i int) {
		pe := eligible[i]
		t0 := r.opts.now()
		sel, err := pe.p.Probe(ctx, p.prompt(pe.cfg.BlockSize))
		d := r.opts.now().Sub(t0)
		results[i] = probeResult{pe: pe, sel: sel, err: err, dur: d}
		outcome := "ok"
		switch {
		case errors.Is(err, pool.ErrCircuitOpen):
			outcome = "circuit_open"
		case err != nil:
			outcome = "error"
		}
		r.m.probe.WithLabelValues(pe.cfg.Name, outcome).Observe(d.Seconds())
	}
	if len(eligible) == 0 {
		return results
	}
	// One goroutine fewer than pools: the caller probes the last pool.
	var wg sync.WaitGroup
	for i := range len(eligible) - 1 {
		wg.Go(func() { one(i) })
	}
	one(len(eligible) - 1)
	wg.Wait()
	return results
}

func endpoint(poolName string, s pool.Selection) Endpoint {
	return Endpoint{Pool: poolName, WorkerID: s.WorkerID, DPRank: s.DPRank, Address: s.Address, OverlapBlocks: s.OverlapBlocks, Cost: s.Cost}
}

func candEndpoint(c policies.Candidate) Endpoint {
	return Endpoint{Pool: c.Pool, WorkerID: c.Probe.WorkerID, DPRank: c.Probe.DPRank, Address: c.Probe.Address, OverlapBlocks: c.Probe.OverlapBlocks, Cost: c.Probe.Cost}
}

// commit records the request on the best-ranked candidate whose local
// router takes the commit, in rank order; the candidates after it are the
// fallbacks. The commit is pipelined: sent on the Track stream, not waited
// for, so the decision costs one round trip to the local routers (the
// probe), not two. A commit that cannot be sent (no router, a broken
// connection) moves on to the next candidate as before; one the router
// refuses after the decision was made (the worker left, say) is counted,
// logged, and surfaces on the lease (ErrCommitRefused): the request still
// goes to the worker the probe chose, unaccounted on its local router
// (docs/perf-decision.md weighs the trade).
func (r *Router) commit(ctx context.Context, st *state, p *prepared, results []probeResult, ranked []policies.Candidate, trace *policies.Trace, pinned bool) (*Decision, error) {
	var refused []string
	for i, c := range ranked {
		res := find(results, c.Pool)
		l := &lease{}
		tr, err := res.pe.p.Commit(ctx, res.sel.Router, pool.Commit{
			RequestID: p.id, WorkerID: c.Probe.WorkerID, DPRank: c.Probe.DPRank, Prompt: p.prompt(res.pe.cfg.BlockSize),
		}, r.committed(p.id, c.Pool, c.Probe.WorkerID, &l.mainRefused))
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.m.refusedCommits.WithLabelValues(c.Pool).Inc()
			r.log.Warn("commit refused; trying the next candidate", "request_id", p.id, "pool", c.Pool, "worker_id", c.Probe.WorkerID, "err", err)
			refused = append(refused, fmt.Sprintf("%s/%s: %v", c.Pool, c.Probe.WorkerID, err))
			if pinned {
				return nil, pinError(HeaderPool, c.Pool, err)
			}
			continue
		}
		l.main = tr
		d := &Decision{Primary: candEndpoint(c), ISL: len(p.tokens), RequestBlocks: c.Probe.RequestBlocks, Lease: l}
		if c.Prefill != nil {
			pres := find(results, c.Prefill.Pool)
			ptr, err := pres.pe.p.Commit(ctx, pres.sel.Router, pool.Commit{
				RequestID: p.id, WorkerID: c.Prefill.Probe.WorkerID, DPRank: c.Prefill.Probe.DPRank, Prompt: p.prompt(pres.pe.cfg.BlockSize),
			}, r.committed(p.id, c.Prefill.Pool, c.Prefill.Probe.WorkerID, nil))
			if err != nil {
				// The decode worker prefills locally rather than failing
				// a request it can serve.
				r.m.refusedCommits.WithLabelValues(c.Prefill.Pool).Inc()
				r.log.Warn("prefill commit refused; the decode worker prefills", "request_id", p.id, "pool", c.Prefill.Pool, "err", err)
				refused = append(refused, fmt.Sprintf("prefill %s/%s: %v", c.Prefill.Pool, c.Prefill.Probe.WorkerID, err))
			} else {
				l.prefill = ptr
				e := candEndpoint(*c.Prefill)
				d.Prefill = &e
			}
		}
		for _, f := range ranked[i+1:] {
			d.Fallbacks = append(d.Fallbacks, candEndpoint(f))
		}
		if trace != nil {
			d.Explanation = explain(p, st, results, ranked[i:], trace, refused)
			r.log.Debug("decision", "request_id", p.id, "explanation", d.Explanation)
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w: every ranked pool refused the commit: %v", ErrNoPool, refused)
}

// committed returns the listener of a pipelined commit's answer: a
// refusal is counted, logged and, when into is set, kept for the lease.
func (r *Router) committed(id, poolName, worker string, into *atomic.Pointer[error]) func(pool.Selection, error) {
	return func(_ pool.Selection, err error) {
		if err == nil {
			return
		}
		r.m.refusedCommits.WithLabelValues(poolName).Inc()
		r.log.Warn("commit refused after the decision; the request goes to the probed worker unaccounted", "request_id", id, "pool", poolName, "worker_id", worker, "err", err)
		if into != nil {
			err = fmt.Errorf("%w: pool %q worker %q: %w", ErrCommitRefused, poolName, worker, err)
			into.Store(&err)
		}
	}
}

func find(results []probeResult, poolName string) probeResult {
	for _, r := range results {
		if r.pe.cfg.Name == poolName {
			return r
		}
	}
	panic("globalrouter: candidate without a probe: " + poolName)
}

// decidePinnedWorker commits the request on the pinned worker, in the
// pinned pool or in the first eligible pool that knows the worker.
func (r *Router) decidePinnedWorker(ctx context.Context, st *state, p *prepared, eligible []*poolEntry, worker string) (*Decision, error) {
	var rank uint32
	if s := p.req.Headers[HeaderDPRank]; s != "" {
		v, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %q is not a rank", ErrPinRefused, HeaderDPRank, s)
		}
		rank = uint32(v)
	}
	var refused []error
	for _, pe := range eligible {
		if pe.cfg.Role == policies.RolePrefill {
			continue
		}
		tr, sel, err := pe.p.Track(ctx, "", pool.Commit{RequestID: p.id, WorkerID: worker, DPRank: rank, Prompt: p.prompt(pe.cfg.BlockSize)})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			refused = append(refused, err)
			continue
		}
		d := &Decision{Primary: endpoint(pe.cfg.Name, sel), ISL: len(p.tokens), RequestBlocks: sel.RequestBlocks, Lease: &lease{main: tr}}
		if p.req.Explain {
			d.Explanation = fmt.Sprintf("model=%s isl=%d; pinned by %s=%s: pool %s, worker %s rank %d (%s), overlap %d/%d blocks",
				p.req.Model, len(p.tokens), HeaderWorkerID, worker, pe.cfg.Name, sel.WorkerID, sel.DPRank, sel.Address, sel.OverlapBlocks, sel.RequestBlocks)
		}
		return d, nil
	}
	if len(refused) == 0 {
		return nil, fmt.Errorf("%w: %s: %q: no eligible pool", ErrPinRefused, HeaderWorkerID, worker)
	}
	// The worker may live in a pool that is unreachable: then it is an
	// outage, whatever the other pools said.
	for _, err := range refused {
		if outage(err) {
			return nil, pinError(HeaderWorkerID, worker, err)
		}
	}
	return nil, pinError(HeaderWorkerID, worker, errors.Join(refused...))
}

// pinError is the error of a pinned request that cannot go where it is
// pinned: ErrNoPool (503, retry later) when the target's local routers are
// unreachable, ErrPinRefused (400) when the target refuses the request
// (unknown worker, wrong model, dropped by a policy). Never re-routed.
func pinError(header, target string, err error) error {
	if outage(err) {
		return fmt.Errorf("%w: %s: %q is unreachable: %w", ErrNoPool, header, target, err)
	}
	return fmt.Errorf("%w: %s: %q: %w", ErrPinRefused, header, target, err)
}

// outage reports whether every error in err is a router outage (circuit
// open, no routers, unreachable, timed out), not a refusal.
func outage(err error) bool {
	if err == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !outage(e) {
				return false
			}
		}
		return true
	}
	var pe *pool.ProbeError
	switch {
	case errors.Is(err, pool.ErrCircuitOpen), errors.Is(err, pool.ErrNoRouters),
		errors.As(err, &pe) && pe.Backoff > 0, errors.Is(err, context.DeadlineExceeded):
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// lease is a Decision's Lease: the request on its worker's local router,
// and on the prefill worker's when disaggregated.
type lease struct {
	main    pool.Tracker
	prefill pool.Tracker
	// mainRefused is set when main's pipelined commit was refused.
	mainRefused atomic.Pointer[error]
}

var _ Lease = (*lease)(nil)

// PrefillComplete implements Lease: the first token came back, so the
// prefill worker's part is over. A refused commit surfaces here as
// ErrCommitRefused.
func (l *lease) PrefillComplete(ctx context.Context) error {
	err := l.main.PrefillComplete(ctx)
	if refused := l.mainRefused.Load(); refused != nil {
		err = *refused
	}
	if l.prefill != nil {
		err = errors.Join(err, l.prefill.Free(ctx))
	}
	return err
}

// Free implements Lease. A refused commit has nothing to free: the stream
// is closed and nil returned.
func (l *lease) Free(ctx context.Context) error {
	err := l.main.Free(ctx)
	if l.prefill != nil {
		err = errors.Join(err, l.prefill.Free(ctx))
	}
	return err
}
