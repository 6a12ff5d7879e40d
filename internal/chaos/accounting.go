package chaos

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/up"
)

// AccountingInterval is how often -accounting samples the routers'
// in-flight count and the engines' running+waiting.
const AccountingInterval = 100 * time.Millisecond

// AccountingWindow is the window the samples are checked against (issue
// 27's target: the two counts equal within 1 s).
const AccountingWindow = time.Second

// AccountingReport is -accounting's part of the report: the sampled
// comparison (up.AnalyzeAccounting), the counts once the traffic stopped,
// and what became of the best-effort decisions.
type AccountingReport struct {
	up.AccountingReport
	// AfterRouters and AfterEngines are the two counts at the end (after
	// up to 10 s after the leaked-load wait); AfterSeconds is how long
	// after the traffic's end both first read 0 (-1: not within that).
	AfterRouters int     `json:"after_routers"`
	AfterEngines int     `json:"after_engines"`
	AfterSeconds float64 `json:"after_seconds"`
	// BestEffort is kvgate_globalrouter_best_effort_total ("decisions")
	// and kvgate_globalrouter_best_effort_outcomes_total by outcome.
	BestEffort map[string]float64 `json:"best_effort"`
	// Contended is kvgate_globalrouter_contended_commits_total by outcome
	// (decide-and-commits placed again under the router's recheck lock).
	Contended map[string]float64 `json:"contended"`
	// PerRequest compares the two request by request (perrequest.go).
	PerRequest *PerRequest `json:"per_request,omitempty"`
}

// sampleAccounting samples sys until ctx ends; the result is sent on the
// returned channel.
func sampleAccounting(ctx context.Context, sys *up.System) <-chan []up.AccountingSample {
	out := make(chan []up.AccountingSample, 1)
	go func() { out <- sys.SampleAccounting(ctx, AccountingInterval) }()
	return out
}

// accountingReport analyses samples and rec's records; end is when the
// traffic stopped.
func accountingReport(sys *up.System, rec *recorder, samples []up.AccountingSample, end time.Time) *AccountingReport {
	rep := &AccountingReport{AccountingReport: up.AnalyzeAccounting(samples, AccountingWindow), AfterSeconds: -1, BestEffort: BestEffortCounts(sys.Registry), Contended: counterBy(sys.Registry, "kvgate_globalrouter_contended_commits_total", "outcome")}
	// Both counts back to 0: the last frees and the engines' aborts of
	// the requests the end of the run cut off land.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep.AfterRouters, rep.AfterEngines = sys.InFlight()
		if rep.AfterRouters == 0 && rep.AfterEngines == 0 {
			rep.AfterSeconds = time.Since(end).Seconds()
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	rep.PerRequest = rec.report(AccountingWindow, samples, end)
	return rep
}

// BestEffortCounts sums the best-effort counters of reg over the pools:
// kvgate_globalrouter_best_effort_total as "decisions", and
// kvgate_globalrouter_best_effort_outcomes_total by outcome (empty when
// the registry cannot be gathered).
func BestEffortCounts(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "kvgate_globalrouter_best_effort_total":
				out["decisions"] += m.GetCounter().GetValue()
			case "kvgate_globalrouter_best_effort_outcomes_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" {
						out[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return out
}

// counterBy sums the counter name of reg by the value of label.
func counterBy(reg *prometheus.Registry, name, label string) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// print writes the report for people (Report.Print).
func (a *AccountingReport) print(w io.Writer) {
	fmt.Fprintf(w, "accounting (every %v): %d samples, %d with the routers' in-flight count other than the engines' running+waiting, max difference %d, longest run of differing samples %.1f s\n",
		AccountingInterval, a.Samples, a.Diverged, a.MaxDivergence, a.LongestDivergenceSeconds)
	fmt.Fprintf(w, "  outside the engines' range within ±%.0f s: %d (below: %d, above: %d) %s\n", a.WindowSeconds, a.OutsideWindow, a.Below, a.Above, a.FirstOutside)
	fmt.Fprintf(w, "  shift to an equal engines' count: p50 %.1f s, p99 %.1f s, max %.1f s; none within ±5 s: %d\n", a.ShiftP50Seconds, a.ShiftP99Seconds, a.ShiftMaxSeconds, a.Unmatched)
	fmt.Fprintf(w, "  against the global router's decisions in flight: %d samples differ, by at most %d (unaccounted at most %d; best-effort commits queued at most %d), longest run %.1f s\n",
		a.DecidedDiverged, a.DecidedMaxDivergence, a.Unaccounted, a.MaxLate, a.DecidedLongestDivergenceSeconds)
	fmt.Fprintf(w, "  after the traffic: routers %d, engines %d (both 0 after %.1f s); best effort %v; contended commits %v\n", a.AfterRouters, a.AfterEngines, a.AfterSeconds, a.BestEffort, a.Contended)
	if p := a.PerRequest; p != nil {
		p.print(w, a.WindowSeconds)
	}
}
