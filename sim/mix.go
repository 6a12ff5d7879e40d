package sim

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// The figures of an overload run, per priority band and per tenant
// (issue 24): each request's TTFT against its priority's SLO, what was
// refused, goodput and Jain's fairness index over the tenants.

// DefaultTenantHeader names the tenant of --tenant-mix requests when the
// replayed configuration has no tenancy.header (the replay then sets it,
// so the router reads it as it would the configured one).
const DefaultTenantHeader = "x-tenant"

// Default SLO multiples of the trace's unloaded TTFT p99 (each request
// alone on an idle worker, cold cache: the floor). The highest priority
// of the mix is interactive traffic: twice the floor leaves room for one
// request's worth of waiting ahead of the slowest 1 %. Every lower band is
// background traffic that tolerates queueing: ten times the floor.
const (
	DefaultSLOHighMultiple = 2
	DefaultSLOLowMultiple  = 10
)

// ParseSLO parses "--slo-ms 1=500,0=5000": a TTFT target in milliseconds
// per integer priority. Targets are positive and finite; a priority listed
// twice, a non-integer priority or an empty list is an error naming the
// entry.
func ParseSLO(s string) (map[int]float64, error) {
	out := map[int]float64{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, v, ok := strings.Cut(part, "=")
		p, v = strings.TrimSpace(p), strings.TrimSpace(v)
		prio, perr := strconv.Atoi(p)
		ms, verr := strconv.ParseFloat(v, 64)
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: slo: %q is not priority=milliseconds", ErrConfig, part)
		case perr != nil:
			return nil, fmt.Errorf("%w: slo: %q: priority %q is not an integer", ErrConfig, part, p)
		case verr != nil || !(ms > 0) || math.IsInf(ms, 0):
			return nil, fmt.Errorf("%w: slo: %q: %q is not a positive number of milliseconds", ErrConfig, part, v)
		}
		if _, dup := out[prio]; dup {
			return nil, fmt.Errorf("%w: slo: priority %d listed twice", ErrConfig, prio)
		}
		out[prio] = ms
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: slo: empty", ErrConfig)
	}
	return out, nil
}

// ParseLoad parses "--load 0.7" (or "2x"): the offered load as a multiple
// of the measured capacity; positive and finite.
func ParseLoad(s string) (float64, error) {
	x, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "x"), 64)
	if err != nil || !(x > 0) || math.IsInf(x, 0) {
		return 0, fmt.Errorf("%w: load %q: want a positive multiple of the capacity, such as 0.7 or 2", ErrConfig, s)
	}
	return x, nil
}

// priorities are the priority values requests carry: the mix's, or 0
// (the router's default) without one.
func (c Config) priorities() []int {
	if c.Global == nil || len(c.Global.Priorities) == 0 {
		return []int{0}
	}
	var out []int
	for _, s := range c.Global.Priorities {
		p, _ := strconv.Atoi(s.Value) // validated
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// sloTargets is the TTFT target of each priority: Config.SLOMS, or the
// defaults from the unloaded TTFT p99 (DefaultSLOHighMultiple for the
// highest priority of the mix, DefaultSLOLowMultiple below it).
func (c Config) sloTargets(unloadedP99 float64) (map[int]float64, error) {
	prios := c.priorities()
	if c.SLOMS != nil {
		for p := range c.SLOMS {
			if !slices.Contains(prios, p) {
				return nil, fmt.Errorf("%w: slo: priority %d is not one the requests carry (%v)", ErrConfig, p, prios)
			}
		}
		for _, p := range prios {
			if _, ok := c.SLOMS[p]; !ok {
				return nil, fmt.Errorf("%w: slo: no target for priority %d (the requests carry %v)", ErrConfig, p, prios)
			}
		}
		return c.SLOMS, nil
	}
	out := make(map[int]float64, len(prios))
	for _, p := range prios {
		k := float64(DefaultSLOLowMultiple)
		if p == prios[len(prios)-1] {
			k = DefaultSLOHighMultiple
		}
		out[p] = math.Ceil(k * unloadedP99)
	}
	return out, nil
}

// ClassFigures are one priority band's or one tenant's figures.
type ClassFigures struct {
	// Offered requests; Completed served them; Rejected were refused
	// (429/503 from Decide, or never fitting a KV cache): nothing else.
	Offered   int `json:"offered"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`
	// TTFTMS is over the completed requests.
	TTFTMS Dist `json:"ttft_ms"`
	// SLOMet counts completed requests whose TTFT met their priority's
	// target; SLOMetRatio is SLOMet / Offered (a refused request missed).
	SLOMet      int     `json:"slo_met"`
	SLOMetRatio float64 `json:"slo_met_ratio"`
	// GoodputRPS is SLOMet per second of the offered window.
	GoodputRPS float64 `json:"goodput_rps"`
	ttfts      []float64
}

// JainIndex is Jain's fairness index of xs, (Σx)² / (n·Σx²): 1 when all
// are equal, 1/n when one takes everything (R. Jain, D. Chiu, W. Hawe, "A
// Quantitative Measure of Fairness and Discrimination for Resource
// Allocation in Shared Computer Systems", DEC-TR-301, 1984). It is 0 for
// no values or all zero.
func JainIndex(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if len(xs) == 0 || sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// classify fills res's per-priority and per-tenant figures, goodput and
// fairness from r's records.
func (r *run) classify(res *Result) {
	var first, last time.Time
	for i, rec := range r.recs {
		if i == 0 || rec.arrival.Before(first) {
			first = rec.arrival
		}
		if rec.arrival.After(last) {
			last = rec.arrival
		}
	}
	// The offered window: runs of one trace at one load divide by the
	// same time whatever they refused or queued.
	window := last.Sub(first).Seconds()
	res.SLOMS = map[string]float64{}
	for p, v := range r.cfg.SLOMS {
		res.SLOMS[strconv.Itoa(p)] = v
	}
	res.ByPriority = map[string]*ClassFigures{}
	if r.tenantHeader != "" {
		res.ByTenant = map[string]*ClassFigures{}
	}
	add := func(m map[string]*ClassFigures, key string, rec *record, met bool, ttft float64) {
		c := m[key]
		if c == nil {
			c = &ClassFigures{}
			m[key] = c
		}
		c.Offered++
		switch {
		case rec.rejected:
			c.Rejected++
		default:
			c.Completed++
			c.ttfts = append(c.ttfts, ttft)
			if met {
				c.SLOMet++
			}
		}
	}
	met := 0
	for i := range r.recs {
		rec := &r.recs[i]
		var ttft float64
		ok := false
		if !rec.rejected {
			ttft = ms(rec.first.Sub(rec.arrival))
			ok = ttft <= r.cfg.SLOMS[rec.priority]
		}
		if ok {
			met++
		}
		add(res.ByPriority, strconv.Itoa(rec.priority), rec, ok, ttft)
		if res.ByTenant != nil {
			add(res.ByTenant, rec.tenant, rec, ok, ttft)
		}
	}
	finish := func(m map[string]*ClassFigures) {
		for _, c := range m {
			c.TTFTMS = dist(c.ttfts)
			c.SLOMetRatio = ratio(float64(c.SLOMet), float64(c.Offered))
			if window > 0 {
				c.GoodputRPS = float64(c.SLOMet) / window
			}
		}
	}
	finish(res.ByPriority)
	finish(res.ByTenant)
	res.SLOMetRatio = ratio(float64(met), float64(len(r.recs)))
	if window > 0 {
		res.GoodputRPS = float64(met) / window
	}
	if res.ByTenant != nil {
		// Served throughput normalised by demand: each tenant's share of
		// its own offered requests that was served.
		var xs, demand, served []float64
		total := 0.0
		for _, t := range sortedKeys(res.ByTenant) {
			c := res.ByTenant[t]
			xs = append(xs, ratio(float64(c.Completed), float64(c.Offered)))
			demand = append(demand, float64(c.Offered))
			served = append(served, float64(c.Completed))
			total += float64(c.Completed)
		}
		j := JainIndex(xs)
		res.JainFairness = &j
		// Normalised instead by each tenant's max-min fair share.
		fair := MaxMinShares(demand, total)
		for i := range xs {
			xs[i] = ratio(served[i], fair[i])
		}
		jm := JainIndex(xs)
		res.JainMaxMin = &jm
	}
}

// MaxMinShares is the max-min fair allocation of total between demands
// (water-filling): every demand below the common level is met in full,
// the others get the level. Shares sum to min(total, Σ demands).
func MaxMinShares(demands []float64, total float64) []float64 {
	out := make([]float64, len(demands))
	idx := make([]int, len(demands))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(demands[a], demands[b]) })
	left := total
	for k, i := range idx {
		level := left / float64(len(idx)-k)
		out[i] = min(max(demands[i], 0), level)
		left -= out[i]
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// writeClasses writes each result's figures by priority and by tenant,
// refused requests included.
func (rep *Report) writeClasses(w io.Writer) error {
	if !rep.classes {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := false
	for _, r := range rep.Results {
		if r.ByPriority == nil {
			continue
		}
		if !head {
			fmt.Fprintln(w)
			fmt.Fprintln(tw, "result\tclass\toffered\tserved\trejected\tTTFT mean\tp99 ms\tSLO ms\tSLO met\tgoodput/s\t")
			head = true
		}
		row := func(class string, c *ClassFigures, slo string) {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%.3f\t%.3f\t\n", r.Label(), class, c.Offered, c.Completed, c.Rejected,
				f0(c.TTFTMS.Mean), f0(c.TTFTMS.P99), slo, c.SLOMetRatio, c.GoodputRPS)
		}
		prios := sortedKeys(r.ByPriority)
		slices.SortFunc(prios, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return y - x })
		for _, p := range prios {
			row("priority "+p, r.ByPriority[p], f0(r.SLOMS[p]))
		}
		for _, t := range sortedKeys(r.ByTenant) {
			row("tenant "+t, r.ByTenant[t], "-")
		}
		jain := "-"
		if r.JainFairness != nil {
			jain = strconv.FormatFloat(*r.JainFairness, 'f', 3, 64)
		}
		if r.JainMaxMin != nil {
			jain += ", max-min " + strconv.FormatFloat(*r.JainMaxMin, 'f', 3, 64)
		}
		fmt.Fprintf(tw, "%s\tall (Jain %s)\t%d\t%d\t%d\t%s\t%s\t-\t%.3f\t%.3f\t\n", r.Label(), jain, r.Completed+r.Rejected, r.Completed, r.Rejected,
			f0(r.TTFTMS.Mean), f0(r.TTFTMS.P99), r.SLOMetRatio, r.GoodputRPS)
	}
	return tw.Flush()
}
