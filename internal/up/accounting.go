package up

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

// Observers watch a System request by request, each through the part's own
// observer interface: Decisions every decision of the global router (after
// the status page's recorder) and Freed each decision's lease freed, Router each pool's local router's lifecycle
// state (localrouter.ActiveObserver; a restarted router gets the pool's
// again), Engine each mock worker's ranks (mocker.RequestObserver; a
// restarted worker too). `kvgate bench -chaos -accounting` joins them by
// request id (internal/chaos). Each may be nil.
type Observers struct {
	Decisions func(globalrouter.Observation)
	// Freed is the global router's WithFreeObserver.
	Freed  func(id string, at time.Time)
	Router func(pool string) localrouter.ActiveObserver
	Engine func(pool, worker string) mocker.RequestObserver
}

// observeRouter makes the pool's observer (if any) watch its local
// router's lifecycle state.
func (p *Pool) observeRouter() {
	if p.obs != nil {
		p.Router.Router().Active().Observe(p.obs)
	}
}

// InFlight reports the requests the system's local routers hold in flight
// (every pool whose router runs) and the requests its engines hold
// (running plus waiting, every worker of those pools): what issue 27 item
// 4 compares. The two are read one after the other, not atomically.
func (s *System) InFlight() (routers, engines int) {
	for _, p := range s.Pools {
		if p.RouterStopped() {
			continue
		}
		routers += p.Requests()
		for _, w := range p.Workers {
			st := w.Stats()
			engines += st.Running + st.Waiting
		}
	}
	return routers, engines
}

// AccountingSample is one reading of InFlight, with the global router's
// unfreed decisions (globalrouter.Router.Leases) as Decided.
type AccountingSample struct {
	At      time.Time
	Routers int
	Engines int
	Decided int
	// Late is the global router's best-effort commits still queued
	// (globalrouter.Router.LateCommits).
	Late int
}

// SampleAccounting reads InFlight every interval until ctx ends and
// returns the readings.
func (s *System) SampleAccounting(ctx context.Context, interval time.Duration) []AccountingSample {
	var out []AccountingSample
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		// The reads are not atomic: Decided is read before and after the
		// routers, and the smaller kept, so that a decision made or freed
		// between the reads does not count as one the routers miss.
		d, late := 0, 0
		if s.Global != nil {
			d, late = s.Global.Leases(), s.Global.LateCommits()
		}
		r, e := s.InFlight()
		if s.Global != nil {
			d = min(d, s.Global.Leases())
		}
		out = append(out, AccountingSample{At: time.Now(), Routers: r, Engines: e, Decided: d, Late: late})
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
	}
}

// AccountingReport compares the routers' in-flight count with the
// engines' running+waiting over a run's samples.
type AccountingReport struct {
	Samples int `json:"samples"`
	// Diverged is the number of samples where the two counts differ.
	Diverged int `json:"diverged"`
	// MaxDivergence is the largest |routers − engines| of a sample.
	MaxDivergence int `json:"max_divergence"`
	// LongestDivergenceSeconds is the longest run of consecutive samples
	// that differ, from its first sample to the next sample that agrees
	// (on a busy system requests start and end all the time, so short
	// differences overlap: this is not one request's lag).
	LongestDivergenceSeconds float64 `json:"longest_divergence_seconds"`
	// WindowSeconds is the accounting window checked: each sample's
	// routers count must lie within the range the engines' count took in
	// the samples up to that long before and after it.
	WindowSeconds float64 `json:"window_seconds"`
	// OutsideWindow counts the samples whose routers count lies outside
	// that range (0: the routers' count equals the engines' within the
	// window throughout): Below it (requests the engines ran and no router
	// counted: unaccounted) or Above it (requests the routers counted
	// that no engine held within the window: in transit between the
	// decision and the engine, or between the engine's last token and the
	// response's end at the ext_proc server, for longer than the window;
	// or phantom load).
	OutsideWindow int `json:"outside_window"`
	Below         int `json:"below"`
	Above         int `json:"above"`
	// FirstOutside describes the first such sample ("" when none).
	FirstOutside string `json:"first_outside,omitempty"`
	// The shift: for each sample, the smallest |t'−t| such that the
	// engines' count at a sample t' equals the routers' count at t (0 when
	// they agree), looked for up to maxShift either way: its percentiles
	// over the samples that found one, and how many found none
	// (Unmatched).
	ShiftP50Seconds float64 `json:"shift_p50_seconds"`
	ShiftP99Seconds float64 `json:"shift_p99_seconds"`
	ShiftMaxSeconds float64 `json:"shift_max_seconds"`
	Unmatched       int     `json:"unmatched"`
	// The routers' count against the global router's decisions in flight
	// (Decided): the accounting itself, without the requests' transit to
	// and from the engines. DecidedDiverged samples differ, by at most
	// DecidedMaxDivergence; Unaccounted is the largest Decided − Routers
	// (decisions no router counted yet), and DecidedLongestDivergenceSeconds
	// the longest run of differing samples.
	DecidedDiverged                 int     `json:"decided_diverged"`
	DecidedMaxDivergence            int     `json:"decided_max_divergence"`
	Unaccounted                     int     `json:"unaccounted"`
	DecidedLongestDivergenceSeconds float64 `json:"decided_longest_divergence_seconds"`
	// MaxLate is the most best-effort commits queued at a sample.
	MaxLate int `json:"max_late"`
}

// maxShift bounds the search for an equal engines' count (AccountingReport
// shift fields).
const maxShift = 5 * time.Second

// AnalyzeAccounting is the report of samples (in time order) for window.
func AnalyzeAccounting(samples []AccountingSample, window time.Duration) AccountingReport {
	rep := AccountingReport{Samples: len(samples), WindowSeconds: window.Seconds()}
	var runStart time.Time
	inRun := false
	lo := 0
	for i, s := range samples {
		d := s.Routers - s.Engines
		if d < 0 {
			d = -d
		}
		rep.MaxDivergence = max(rep.MaxDivergence, d)
		switch {
		case d != 0:
			rep.Diverged++
			if !inRun {
				inRun, runStart = true, s.At
			}
		case inRun:
			inRun = false
			rep.LongestDivergenceSeconds = max(rep.LongestDivergenceSeconds, s.At.Sub(runStart).Seconds())
		}
		// The engines' range within ±window of this sample.
		for samples[lo].At.Before(s.At.Add(-window)) {
			lo++
		}
		minE, maxE := s.Engines, s.Engines
		for j := lo; j < len(samples) && !samples[j].At.After(s.At.Add(window)); j++ {
			minE, maxE = min(minE, samples[j].Engines), max(maxE, samples[j].Engines)
		}
		if s.Routers < minE {
			rep.Below++
		}
		if s.Routers > maxE {
			rep.Above++
		}
		if s.Routers < minE || s.Routers > maxE {
			rep.OutsideWindow++
			if rep.FirstOutside == "" {
				rep.FirstOutside = fmt.Sprintf("sample %d at +%.1f s: routers %d, engines %d..%d within ±%v", i, s.At.Sub(samples[0].At).Seconds(), s.Routers, minE, maxE, window)
			}
		}
	}
	var dStart time.Time
	dRun := false
	for _, s := range samples {
		rep.MaxLate = max(rep.MaxLate, s.Late)
		d := s.Decided - s.Routers
		rep.Unaccounted = max(rep.Unaccounted, d)
		if d < 0 {
			d = -d
		}
		rep.DecidedMaxDivergence = max(rep.DecidedMaxDivergence, d)
		switch {
		case d != 0:
			rep.DecidedDiverged++
			if !dRun {
				dRun, dStart = true, s.At
			}
		case dRun:
			dRun = false
			rep.DecidedLongestDivergenceSeconds = max(rep.DecidedLongestDivergenceSeconds, s.At.Sub(dStart).Seconds())
		}
	}
	if dRun {
		rep.DecidedLongestDivergenceSeconds = max(rep.DecidedLongestDivergenceSeconds, samples[len(samples)-1].At.Sub(dStart).Seconds())
	}
	var shifts []time.Duration
	for _, s := range samples {
		best, found := time.Duration(0), false
		for j := range samples {
			d := samples[j].At.Sub(s.At)
			if d < 0 {
				d = -d
			}
			if d > maxShift || samples[j].Engines != s.Routers || (found && d >= best) {
				continue
			}
			best, found = d, true
		}
		if !found {
			rep.Unmatched++
			continue
		}
		shifts = append(shifts, best)
	}
	if len(shifts) > 0 {
		slices.Sort(shifts)
		rep.ShiftP50Seconds = shifts[len(shifts)*50/100].Seconds()
		rep.ShiftP99Seconds = shifts[min(len(shifts)-1, len(shifts)*99/100)].Seconds()
		rep.ShiftMaxSeconds = shifts[len(shifts)-1].Seconds()
	}
	if inRun && len(samples) > 0 {
		rep.LongestDivergenceSeconds = max(rep.LongestDivergenceSeconds, samples[len(samples)-1].At.Sub(runStart).Seconds())
	}
	return rep
}

// observeDecision is the global router's observer: the status page's
// recorder, then Observers.Decisions.
func (s *System) observeDecision(o globalrouter.Observation) {
	s.Decisions.Observe(o)
	if f := s.cfg.Observers.Decisions; f != nil {
		f(o)
	}
}
