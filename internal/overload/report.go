package overload

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/sim"
)

// Report is what a run measured; its figures have the replay's names and
// meanings (sim.Result: by_priority, by_tenant, jain_fairness,
// goodput_rps).
type Report struct {
	Load float64 `json:"load"`
	// FlowControl: the in-process system's global router queued requests
	// (Config.Up.FlowControl) instead of shedding them.
	FlowControl bool `json:"flow_control"`
	// UnloadedTTFTMS and UnloadedE2EMS are the slowest TTFT and whole
	// duration of 8 requests sent one at a time to the idle system; the
	// second is the floor of the default SLOs.
	UnloadedTTFTMS float64 `json:"unloaded_ttft_ms"`
	UnloadedE2EMS  float64 `json:"unloaded_e2e_ms"`
	// CapacityRPS is the completion rate of the calibration's closed-loop
	// clients over its second half; CalibrationRefused the requests the
	// chain refused meanwhile. OfferedRPS is Load × CapacityRPS.
	CapacityRPS        float64            `json:"capacity_rps"`
	CalibrationRefused int                `json:"calibration_refused"`
	OfferedRPS         float64            `json:"offered_rps"`
	WindowSeconds      float64            `json:"window_seconds"`
	SLOMS              map[string]float64 `json:"slo_ms"`
	Sent               int                `json:"sent"`
	Completed          int                `json:"completed"`
	Rejected           int                `json:"rejected"`
	// Failed requests ended otherwise than served or refused (a transport
	// error, another status); FailedSample is the first one's error.
	Failed       int               `json:"failed"`
	FailedSample string            `json:"failed_sample,omitempty"`
	TTFTMS       Dist              `json:"ttft_ms"`
	SLOMetRatio  float64           `json:"slo_met_ratio"`
	GoodputRPS   float64           `json:"goodput_rps"`
	ByPriority   map[string]*Class `json:"by_priority"`
	ByTenant     map[string]*Class `json:"by_tenant,omitempty"`
	JainFairness *float64          `json:"jain_fairness,omitempty"`
	// InFlightAfter is each pool's in-flight count once the load is over
	// (every one must be 0); InFlightChecked says it could be read.
	InFlightAfter     map[string]int `json:"in_flight_after"`
	InFlightChecked   bool           `json:"in_flight_checked"`
	LoadAverageBefore string         `json:"load_average_before"`
	LoadAverageAfter  string         `json:"load_average_after"`
}

// Dist is a TTFT summary in ms.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
}

// Class is one priority's or one tenant's figures (sim.ClassFigures).
type Class struct {
	Offered     int     `json:"offered"`
	Completed   int     `json:"completed"`
	Rejected    int     `json:"rejected"`
	Failed      int     `json:"failed"`
	TTFTMS      Dist    `json:"ttft_ms"`
	SLOMet      int     `json:"slo_met"`
	SLOMetRatio float64 `json:"slo_met_ratio"`
	GoodputRPS  float64 `json:"goodput_rps"`
	ttfts       []float64
}

func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	q := func(p float64) float64 { return s[max(0, min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1))] }
	return Dist{Mean: sum / float64(len(s)), P50: q(0.5), P99: q(0.99)}
}

// figures fills the report from the outcomes.
func (r *Report) figures(outs []outcome, slo map[int]float64) {
	r.ByPriority = map[string]*Class{}
	tenants := false
	for _, o := range outs {
		tenants = tenants || o.tenant != ""
	}
	if tenants {
		r.ByTenant = map[string]*Class{}
	}
	add := func(m map[string]*Class, key string, o outcome, met bool) {
		c := m[key]
		if c == nil {
			c = &Class{}
			m[key] = c
		}
		c.Offered++
		switch {
		case o.refused:
			c.Rejected++
		case o.err != "":
			c.Failed++
		default:
			c.Completed++
			c.ttfts = append(c.ttfts, o.ttftMS)
			if met {
				c.SLOMet++
			}
		}
	}
	var ttfts []float64
	met := 0
	for _, o := range outs {
		r.Sent++
		prio := o.priority
		if prio == "" {
			prio = "0"
		}
		p, _ := strconv.Atoi(prio)
		ok := false
		switch {
		case o.refused:
			r.Rejected++
		case o.err != "":
			r.Failed++
			if r.FailedSample == "" {
				r.FailedSample = o.err
			}
		default:
			r.Completed++
			ttfts = append(ttfts, o.ttftMS)
			ok = o.ttftMS <= slo[p]
		}
		if ok {
			met++
		}
		add(r.ByPriority, prio, o, ok)
		if tenants {
			add(r.ByTenant, o.tenant, o, ok)
		}
	}
	r.TTFTMS = dist(ttfts)
	r.SLOMetRatio = ratio(met, r.Sent)
	r.GoodputRPS = float64(met) / r.WindowSeconds
	for _, m := range []map[string]*Class{r.ByPriority, r.ByTenant} {
		for _, c := range m {
			c.TTFTMS = dist(c.ttfts)
			c.SLOMetRatio = ratio(c.SLOMet, c.Offered)
			c.GoodputRPS = float64(c.SLOMet) / r.WindowSeconds
		}
	}
	if tenants {
		var xs []float64
		for _, t := range sortedKeys(r.ByTenant) {
			xs = append(xs, ratio(r.ByTenant[t].Completed, r.ByTenant[t].Offered))
		}
		j := sim.JainIndex(xs)
		r.JainFairness = &j
	}
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	mode := "shedding (no flow control)"
	if r.FlowControl {
		mode = "flow control (the admission queue)"
	}
	fmt.Fprintf(w, "system: %s\n", mode)
	fmt.Fprintf(w, "unloaded (slowest of 8 alone): TTFT %.1f ms, whole request %.1f ms; capacity %.2f requests/s (closed-loop calibration, %d refused meanwhile); offered %gx = %.2f requests/s for %.0f s\n",
		r.UnloadedTTFTMS, r.UnloadedE2EMS, r.CapacityRPS, r.CalibrationRefused, r.Load, r.OfferedRPS, r.WindowSeconds)
	fmt.Fprintf(w, "load average before %s, after %s\n\n", r.LoadAverageBefore, r.LoadAverageAfter)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "class\toffered\tserved\trejected\tfailed\tTTFT mean\tp99 ms\tSLO ms\tSLO met\tgoodput/s\t")
	row := func(name string, c *Class, slo string) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%.0f\t%s\t%.3f\t%.2f\t\n", name, c.Offered, c.Completed, c.Rejected, c.Failed,
			c.TTFTMS.Mean, c.TTFTMS.P99, slo, c.SLOMetRatio, c.GoodputRPS)
	}
	prios := sortedKeys(r.ByPriority)
	slices.SortFunc(prios, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return y - x })
	for _, p := range prios {
		row("priority "+p, r.ByPriority[p], strconv.FormatFloat(r.SLOMS[p], 'f', 0, 64))
	}
	for _, t := range sortedKeys(r.ByTenant) {
		row("tenant "+t, r.ByTenant[t], "-")
	}
	jainS := "-"
	if r.JainFairness != nil {
		jainS = strconv.FormatFloat(*r.JainFairness, 'f', 3, 64)
	}
	row("all (Jain "+jainS+")", &Class{Offered: r.Sent, Completed: r.Completed, Rejected: r.Rejected, Failed: r.Failed,
		TTFTMS: r.TTFTMS, SLOMetRatio: r.SLOMetRatio, GoodputRPS: r.GoodputRPS}, "-")
	_ = tw.Flush()
	if r.FailedSample != "" {
		fmt.Fprintf(w, "first failure: %s\n", r.FailedSample)
	}
	switch {
	case !r.InFlightChecked:
		fmt.Fprintln(w, "in-flight after: not checked (no admin address)")
	default:
		var parts []string
		for _, p := range sortedKeys(r.InFlightAfter) {
			parts = append(parts, fmt.Sprintf("%s %d", p, r.InFlightAfter[p]))
		}
		fmt.Fprintf(w, "in-flight after (every router must be 0): %s\n", strings.Join(parts, ", "))
	}
}

// loadAverage is /proc/loadavg's first three fields ("?" elsewhere).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
