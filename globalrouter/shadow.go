package globalrouter

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/policies"
)

// Shadow mode: a candidate chain ranks the same probed candidates as the
// live chain, on every request the live chain ranked, and is compared with
// it. It never commits and never changes the decision: it runs on its own
// goroutine, in parallel with the live commit, so the request path pays
// one goroutine start; at most ShadowConfig.MaxInFlight shadow rankings run
// at once and a request past that is skipped (counted), which bounds what
// a slow candidate chain can take from the live one.

// ShadowConfig is the `shadow:` block of a configuration (or the content of
// the file given to WithShadowFile, `kvgate extproc -shadow-config`).
type ShadowConfig struct {
	// Chain is the candidate chain. Its policies take their per-pool
	// arguments from the pools' live policy sections (the entries of the
	// policies the candidate chain runs; the others are ignored).
	Chain []policies.Spec `yaml:"chain"`
	// LogInterval is the least time between two logged disagreements
	// (default 1 s; the metrics count every one).
	LogInterval time.Duration `yaml:"log_interval"`
	// MaxInFlight bounds the shadow rankings running at once (default 64).
	MaxInFlight int `yaml:"max_in_flight"`

	file string // where the block was read from
}

// Shadow defaults.
const (
	DefaultShadowLogInterval = time.Second
	DefaultShadowMaxInFlight = 64
)

// WithShadowFile reads the shadow block from path (a YAML file holding
// what a configuration's `shadow:` block holds), replacing the
// configuration's own, at New and at every reload; WatchFile watches it
// too.
func WithShadowFile(path string) Option { return func(o *options) { o.shadowFile = path } }

// LoadShadowFile reads and strictly decodes a shadow file.
func LoadShadowFile(path string) (*ShadowConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("shadow config: %w", err)
	}
	doc, err := config.ParseFile(path, data)
	if err != nil {
		return nil, err
	}
	var sc ShadowConfig
	if err := config.DecodeStrict(path, "shadow", doc, &sc); err != nil {
		return nil, err
	}
	sc.setFile(path)
	return &sc, nil
}

func (sc *ShadowConfig) setFile(file string) {
	sc.file = file
	for i := range sc.Chain {
		if sc.Chain[i].Args.File == "" {
			sc.Chain[i].Args.File = file
		}
	}
}

// applyShadowFile replaces cfg's shadow block with path's (when set).
func applyShadowFile(cfg *Config, path string) error {
	if path == "" {
		return nil
	}
	sc, err := LoadShadowFile(path)
	if err != nil {
		return err
	}
	cfg.Shadow = sc
	return nil
}

// buildShadow validates the shadow block and builds its chain into
// c.shadowChain (nil without a block).
func (c *Config) buildShadow(reg *policies.Registry) error {
	c.shadowChain = nil
	if c.Shadow == nil {
		return nil
	}
	sc := c.Shadow
	file := sc.file
	if file == "" {
		file = c.file()
	}
	if len(sc.Chain) == 0 {
		return fmt.Errorf("%s: %w: shadow: the candidate chain is empty", file, policies.ErrConfig)
	}
	if sc.LogInterval < 0 || sc.MaxInFlight < 0 {
		return fmt.Errorf("%s: %w: shadow: log_interval and max_in_flight must not be negative", file, policies.ErrConfig)
	}
	if sc.LogInterval == 0 {
		sc.LogInterval = DefaultShadowLogInterval
	}
	if sc.MaxInFlight == 0 {
		sc.MaxInFlight = DefaultShadowMaxInFlight
	}
	in := map[string]bool{}
	for _, s := range sc.Chain {
		in[s.Name] = true
	}
	sections := map[string]policies.PoolSection{}
	names := make([]string, 0, len(c.Pools))
	for _, p := range c.Pools {
		names = append(names, p.Name)
		sec := policies.PoolSection{}
		for name, s := range p.Policy {
			if in[name] {
				sec[name] = s
			}
		}
		if len(sec) > 0 {
			sections[p.Name] = sec
		}
	}
	chain, err := reg.Build(sc.Chain, sections, policies.KnownPools(names...))
	if err != nil {
		// The live chain's errors say "chain"; the candidate's say so.
		var pe *policies.PosError
		if errors.As(err, &pe) {
			pe.What = strings.TrimSpace("shadow " + pe.What)
		}
		return err
	}
	c.shadowChain = chain
	return nil
}

// ShadowChain returns the names of the candidate chain's policies (nil
// without a shadow block).
func (c Config) ShadowChain() []string {
	if c.shadowChain == nil {
		return nil
	}
	return chainNames(c.shadowChain)
}

// shadowMetrics are the kvgate_shadow_* metrics; registered by New whether
// or not a shadow chain is configured (a reload may add one).
type shadowMetrics struct {
	decisions *prometheus.CounterVec // agree
	overlap   prometheus.Histogram
	skipped   *prometheus.CounterVec // reason
}

func newShadowMetrics(reg prometheus.Registerer) (*shadowMetrics, error) {
	m := &shadowMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_shadow_decisions_total",
			Help: "Requests the shadow (candidate) chain ranked alongside the live one, by whether its first choice (pool, worker, prefill pool) agreed with the live chain's.",
		}, []string{"agree"}),
		overlap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_shadow_overlap_difference_blocks",
			Help:    "Cached blocks of the shadow chain's first choice minus those of the live chain's, per shadow decision (0 when they agree).",
			Buckets: []float64{-256, -64, -16, -4, -1, 0, 1, 4, 16, 64, 256},
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_shadow_skipped_total",
			Help: "Requests the shadow chain did not rank, by reason: busy (max_in_flight shadow rankings were running), error (the candidate chain refused every candidate or failed).",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.overlap, m.skipped} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.decisions.WithLabelValues("true")
	m.decisions.WithLabelValues("false")
	return m, nil
}

// shadowRunner runs shadow rankings: the in-flight bound and the log
// sampler, shared across configurations.
type shadowRunner struct {
	m        *shadowMetrics
	inFlight atomic.Int64
	lastLog  atomic.Int64 // unix nanoseconds of the last logged disagreement
}

// shadow ranks cands with st's shadow chain, if any, and compares its first
// choice with live's, on its own goroutine. cands and view are read only
// (Chain.Rank does not modify its input); live is the live first choice.
func (r *Router) shadow(st *state, p *prepared, cands []policies.Candidate, live policies.Candidate) {
	chain := st.cfg.shadowChain
	if chain == nil {
		return
	}
	sr := r.shadowRun
	max := int64(st.cfg.Shadow.MaxInFlight)
	if sr.inFlight.Add(1) > max {
		sr.inFlight.Add(-1)
		sr.m.skipped.WithLabelValues("busy").Inc()
		return
	}
	interval := st.cfg.Shadow.LogInterval
	go func() {
		defer sr.inFlight.Add(-1)
		ranked, err := chain.Rank(&p.view, cands, nil)
		if err != nil {
			sr.m.skipped.WithLabelValues("error").Inc()
			sr.m.decisions.WithLabelValues("false").Inc()
			if sr.sample(r.opts.now(), interval) {
				r.log.Info("shadow chain refused a request the live chain routed", "request_id", p.id, "model", p.req.Model,
					"live_pool", live.Pool, "live_worker_id", live.Probe.WorkerID, "live_overlap_blocks", live.Probe.OverlapBlocks, "err", err)
			}
			return
		}
		cand := ranked[0]
		agree := choice(cand) == choice(live) && cand.Probe.WorkerID == live.Probe.WorkerID
		sr.m.overlap.Observe(float64(cand.Probe.OverlapBlocks - live.Probe.OverlapBlocks))
		if agree {
			sr.m.decisions.WithLabelValues("true").Inc()
			return
		}
		sr.m.decisions.WithLabelValues("false").Inc()
		if sr.sample(r.opts.now(), interval) {
			r.log.Info("shadow chain disagrees with the live chain", "request_id", p.id, "model", p.req.Model, "isl", len(p.tokens),
				"live", choice(live), "live_worker_id", live.Probe.WorkerID, "live_overlap_blocks", live.Probe.OverlapBlocks,
				"shadow", choice(cand), "shadow_worker_id", cand.Probe.WorkerID, "shadow_overlap_blocks", cand.Probe.OverlapBlocks,
				"request_blocks", live.Probe.RequestBlocks, "shadow_ranking", poolList(ranked))
		}
	}()
}

// sample reports whether a disagreement seen at now may be logged: at most
// one per interval.
func (sr *shadowRunner) sample(now time.Time, interval time.Duration) bool {
	for {
		last := sr.lastLog.Load()
		if last != 0 && now.UnixNano()-last < int64(interval) {
			return false
		}
		if sr.lastLog.CompareAndSwap(last, now.UnixNano()) {
			return true
		}
	}
}

// choice names a first choice: its pool, and its prefill pool when paired.
func choice(c policies.Candidate) string {
	if c.Prefill != nil {
		return c.Pool + "+" + c.Prefill.Pool
	}
	return c.Pool
}

func poolList(cs []policies.Candidate) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, choice(c))
	}
	return slices.Clip(out)
}
