package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/mocker"
)

// DefaultScrapePeriod is how often the replay's routers read their
// engines' running, waiting and KV usage when EngineProfile.ScrapePeriod
// is 0: the scrape period `kvgate up` gives its local routers
// (internal/up, MetricsPeriod 500 ms; a bare `kvgate localrouter` scrapes
// only when --router-metrics-period is set).
const DefaultScrapePeriod = 500 * time.Millisecond

// EngineProfile is how the simulated engines run, independent of what the
// routers' scorers are told (policy.go, ttft.go read Config.Speedup and
// the default curves only): per-worker speeds, other curves, noise, and
// how their metrics reach the routers.
type EngineProfile struct {
	// Speeds are per-worker speed factors (0.5: twice as slow), one per
	// worker; empty: all 1. They multiply Config.Speedup.
	Speeds []float64
	// Timing, when set, is the engines' timing model instead of
	// mocker.DefaultCurves; TimingName labels it (the file's name).
	Timing     *mocker.Curves
	TimingName string
	// Noise multiplies each engine iteration's duration by a factor drawn
	// uniformly from [1−Noise, 1+Noise] (mean 1), from a source of the
	// run's seed and the worker's index: deterministic. 0..<1.
	Noise float64
	// ScrapePeriod is how often each engine's running, waiting and KV
	// usage are sampled into its router's engine signals
	// (localrouter.Router.SetEngineSignals, the path the local router's
	// metrics scraper feeds). 0: DefaultScrapePeriod; negative: never.
	ScrapePeriod time.Duration
	// ScrapeDelay is how long after its sampling a scrape reaches the
	// router (the scrape's own latency; 0: at once).
	ScrapeDelay time.Duration
}

// scrapePeriod is the effective period; 0 means no scrapes.
func (p EngineProfile) scrapePeriod() time.Duration {
	switch {
	case p.ScrapePeriod < 0:
		return 0
	case p.ScrapePeriod == 0:
		return DefaultScrapePeriod
	}
	return p.ScrapePeriod
}

// validate checks p against the run's workers and batch budget.
func (p EngineProfile) validate(workers, maxBatched int) error {
	if len(p.Speeds) > 0 && len(p.Speeds) != workers {
		return fmt.Errorf("%w: %d engine speeds for %d workers (give one per worker)", ErrConfig, len(p.Speeds), workers)
	}
	for i, s := range p.Speeds {
		if !(s > 0) || math.IsInf(s, 0) {
			return fmt.Errorf("%w: engine speed %v of worker %d must be a positive number", ErrConfig, s, i)
		}
	}
	if !(p.Noise >= 0 && p.Noise < 1) {
		return fmt.Errorf("%w: engine noise %v must be within 0..1 (exclusive)", ErrConfig, p.Noise)
	}
	if p.ScrapeDelay < 0 {
		return fmt.Errorf("%w: scrape delay %v is negative", ErrConfig, p.ScrapeDelay)
	}
	if p.Timing != nil {
		if err := p.Timing.Validate(maxBatched); err != nil {
			return fmt.Errorf("%w: engine timing %s: %v", ErrConfig, p.TimingName, err)
		}
	}
	return nil
}

// ParseEngineSpeeds parses "1,1,0.5,0.5": one positive speed factor per
// worker.
func ParseEngineSpeeds(s string) ([]float64, error) {
	var out []float64
	for i, part := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: engine speed %d %q is not a positive number", ErrConfig, i+1, part)
		}
		out = append(out, v)
	}
	return out, nil
}

// WorkerTimings is each simulated worker's true timing model, noise aside
// (its mean): the curves (EngineProfile.Timing or the default) with
// Speedup = Config.Speedup × the worker's speed. Index i is worker "w<i>"
// of every topology. Each element is a mocker.Curves. It is what an
// oracle scorer told the truth would use.
func (c Config) WorkerTimings() []mocker.Timing {
	c = c.withDefaults()
	out := make([]mocker.Timing, c.Workers)
	for i := range out {
		out[i] = c.workerCurves(i)
	}
	return out
}

// fastestTiming is the fastest worker's curves (noise aside): what the
// causal oracle prices the earliest prefill with.
func (c Config) fastestTiming() mocker.Timing {
	best := 0
	for i := range c.Workers {
		if c.workerSpeedup(i) > c.workerSpeedup(best) {
			best = i
		}
	}
	return c.workerCurves(best)
}

// workerSpeedup is worker i's speedup: Config.Speedup × its speed.
func (c Config) workerSpeedup(i int) float64 {
	s := c.Speedup
	if i < len(c.Engines.Speeds) {
		s *= c.Engines.Speeds[i]
	}
	return s
}

func (c Config) workerCurves(i int) mocker.Curves {
	cv := mocker.DefaultCurves()
	if c.Engines.Timing != nil {
		cv = *c.Engines.Timing
	}
	if cv.Speedup <= 0 {
		cv.Speedup = 1
	}
	cv.Speedup *= c.workerSpeedup(i)
	return cv
}

// engineTiming is worker i's engine timing in a simulation: its curves,
// with the profile's noise (a fresh source per simulation, so every run
// of a config and seed draws the same factors), metered into busy.
func (c Config) engineTiming(i int, busy *time.Duration) mocker.Timing {
	var t mocker.Timing = c.workerCurves(i)
	if c.Engines.Noise > 0 {
		t = &noisyTiming{model: t, noise: c.Engines.Noise, rng: newRand(c.Seed, 1<<32+uint64(i))}
	}
	return meteredTiming{model: t, busy: busy}
}

// noisyTiming multiplies each iteration's duration by 1 + noise·u, u
// uniform in [−1, 1]. The engine calls IterationTime once per iteration,
// so the draws follow the iterations in order.
type noisyTiming struct {
	model mocker.Timing
	noise float64
	rng   *rand.Rand
}

func (n *noisyTiming) IterationTime(b mocker.Batch) time.Duration {
	f := 1 + n.noise*(2*n.rng.Float64()-1)
	d := time.Duration(float64(n.model.IterationTime(b)) * f)
	return max(d, 1)
}

// EngineReport names the engine profile in the report.
type EngineReport struct {
	// Name is the profile in one line, e.g. "speeds=1,1,0.5,0.5 noise=0.2".
	Name string `json:"name"`
	// Speedup is Config.Speedup; Speeds the per-worker factors (nil: 1).
	Speedup float64   `json:"speedup"`
	Speeds  []float64 `json:"speeds,omitempty"`
	// Timing is the engines' curves (before speeds and speedup) and
	// TimingSource where they come from ("default" or the file).
	Timing       mocker.Curves `json:"timing"`
	TimingSource string        `json:"timing_source"`
	Noise        float64       `json:"noise"`
	// ScrapePeriodMS is how often routers read engine signals (0: never),
	// ScrapeDelayMS how late they arrive.
	ScrapePeriodMS float64 `json:"scrape_period_ms"`
	ScrapeDelayMS  float64 `json:"scrape_delay_ms"`
}

// engineReport describes c's engines.
func (c Config) engineReport() EngineReport {
	p := c.Engines
	r := EngineReport{
		Speedup: c.Speedup, Speeds: p.Speeds, Timing: mocker.DefaultCurves(), TimingSource: "default",
		Noise: p.Noise, ScrapePeriodMS: ms(p.scrapePeriod()), ScrapeDelayMS: ms(p.ScrapeDelay),
	}
	if p.Timing != nil {
		r.Timing, r.TimingSource = *p.Timing, p.TimingName
	}
	var parts []string
	if c.Speedup != 1 {
		parts = append(parts, "speedup="+fnum(c.Speedup))
	}
	if len(p.Speeds) > 0 {
		s := make([]string, len(p.Speeds))
		for i, v := range p.Speeds {
			s[i] = fnum(v)
		}
		parts = append(parts, "speeds="+strings.Join(s, ","))
	}
	if p.Timing != nil {
		parts = append(parts, "timing="+p.TimingName)
	}
	if p.Noise > 0 {
		parts = append(parts, "noise="+fnum(p.Noise))
	}
	if len(parts) == 0 {
		parts = append(parts, "matched")
	}
	if sp := p.scrapePeriod(); sp > 0 {
		parts = append(parts, fmt.Sprintf("scrape=%v+%v", sp, p.ScrapeDelay))
	} else {
		parts = append(parts, "scrape=off")
	}
	r.Name = strings.Join(parts, " ")
	return r
}

func fnum(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
