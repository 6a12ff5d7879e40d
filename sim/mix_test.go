package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// tenantSalted is priorityShed with salted tenancy, so the tenant mix is
// read by the router (and the engines get each tenant's cache_salt).
const tenantSalted = "tenancy: {header: x-org, salt: true}\n" + priorityShed

// The overload figures: every request is counted once per priority and
// once per tenant, as served or refused; the refused are the shed ones;
// the tenants' offered shares follow the mix; goodput and SLO ratios agree
// with the counts; the run is deterministic.
func TestOverloadFigures(t *testing.T) {
	tr := randomTrace(t, 400, 6)
	cfg := Config{Trace: tr, Seed: 4, Workers: 4, KVTokens: 8192, Rate: 20,
		SLOMS: map[int]float64{10: 400, 0: 4000},
		Global: &GlobalReplay{Config: globalConfig(t, tenantSalted), Name: "prio.yaml",
			Priorities: []Share{{"0", 0.5}, {"10", 0.5}},
			Tenants:    []Share{{"a", 4}, {"b", 1}, {"c", 1}, {"d", 1}}}}
	rep := runReport(t, cfg)
	r := rep.Results[0]
	if r.Rejected == 0 {
		t.Fatalf("nothing shed at rate 20: the test needs overload")
	}
	if got := r.SLOMS; !cmp.Equal(got, map[string]float64{"10": 400, "0": 4000}) {
		t.Errorf("slo_ms %v", got)
	}
	var offered, completed, rejected, met int
	for p, c := range r.ByPriority {
		if c.Offered != c.Completed+c.Rejected {
			t.Errorf("priority %s: offered %d ≠ completed %d + rejected %d", p, c.Offered, c.Completed, c.Rejected)
		}
		if p == "10" && c.Rejected != 0 {
			t.Errorf("priority 10: %d rejected, want none (only ≤ 0 is shed)", c.Rejected)
		}
		offered, completed, rejected, met = offered+c.Offered, completed+c.Completed, rejected+c.Rejected, met+c.SLOMet
		if want := float64(c.SLOMet) / float64(c.Offered); c.SLOMetRatio != want {
			t.Errorf("priority %s: slo_met_ratio %v, want %v", p, c.SLOMetRatio, want)
		}
	}
	if offered != len(tr.Requests) || completed != r.Completed || rejected != r.Rejected {
		t.Errorf("by priority: offered %d completed %d rejected %d; want %d, %d, %d", offered, completed, rejected, len(tr.Requests), r.Completed, r.Rejected)
	}
	if len(r.ByTenant) != 4 {
		t.Fatalf("by_tenant %v: want a..d", r.ByTenant)
	}
	tenantOffered := 0
	for _, c := range r.ByTenant {
		tenantOffered += c.Offered
	}
	if tenantOffered != len(tr.Requests) {
		t.Errorf("tenants offered %d, want %d", tenantOffered, len(tr.Requests))
	}
	if a, b := r.ByTenant["a"].Offered, r.ByTenant["b"].Offered; a <= 2*b {
		t.Errorf("tenant a offered %d, b %d: want a about 4× b", a, b)
	}
	if r.JainFairness == nil || *r.JainFairness <= 0 || *r.JainFairness > 1 {
		t.Errorf("jain_fairness %v: want within (0, 1]", r.JainFairness)
	}
	if r.JainMaxMin == nil || *r.JainMaxMin <= 0 || *r.JainMaxMin > 1 {
		t.Errorf("jain_fairness_max_min %v: want within (0, 1]", r.JainMaxMin)
	}
	if got := r.SLOMetRatio; got != float64(met)/float64(len(tr.Requests)) {
		t.Errorf("slo_met_ratio %v, want %d/%d", got, met, len(tr.Requests))
	}
	if r.GoodputRPS <= 0 {
		t.Errorf("goodput_rps %v", r.GoodputRPS)
	}
	var js map[string]any
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b.Bytes(), &js); err != nil {
		t.Fatal(err)
	}
	res := js["results"].([]any)[0].(map[string]any)
	for _, k := range []string{"by_priority", "by_tenant", "jain_fairness", "goodput_rps", "slo_met_ratio"} {
		if _, ok := res[k]; !ok {
			t.Errorf("JSON result lacks %q", k)
		}
	}
	ttft := res["by_priority"].(map[string]any)["0"].(map[string]any)["ttft_ms"].(map[string]any)
	if _, ok := ttft["p99"]; !ok {
		t.Errorf("by_priority.0.ttft_ms lacks p99: %v", ttft)
	}
	b.Reset()
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"priority 10", "priority 0", "tenant a", "Jain"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	if again := runReport(t, cfg); reportJSON(t, again) != reportJSON(t, rep) {
		t.Errorf("two runs of one config differ")
	}
}

// --load: the capacity is measured on the configured pools, and the
// arrivals are scaled to offer load × it.
func TestLoadCalibration(t *testing.T) {
	tr := randomTrace(t, 300, 7)
	base := Config{Trace: tr, Seed: 4, Workers: 4, KVTokens: 8192,
		Global: &GlobalReplay{Config: globalConfig(t, priorityShed), Name: "prio.yaml", Priorities: []Share{{"0", 1}, {"10", 1}}}}
	c, err := Calibrate(testContext(t), base)
	if err != nil {
		t.Fatal(err)
	}
	if c.RPS <= 0 || c.Requests != len(tr.Requests) || c.TraceRPS <= 0 {
		t.Fatalf("capacity %+v", c)
	}
	base.Load = 2
	rep := runReport(t, base)
	if rep.Capacity == nil || rep.Capacity.RPS != c.RPS {
		t.Fatalf("report capacity %+v, want %+v", rep.Capacity, c)
	}
	if want := 2 * c.RPS / c.TraceRPS; math.Abs(rep.Rate-want) > 1e-9*want {
		t.Errorf("rate %v, want %v", rep.Rate, want)
	}
	// Flow control is an admission rule too: the capacity is the same
	// with the queue on.
	fc := base
	fc.Load, fc.FlowControl = 0, true
	if cq, err := Calibrate(testContext(t), fc); err != nil || cq.RPS != c.RPS || cq.Refused != c.Refused {
		t.Errorf("capacity with --flow-control %+v, %v; want %+v", cq, err, c)
	}
	flat := base
	flat.Global = nil
	if _, err := Run(testContext(t), flat); err == nil || !errors.Is(err, ErrConfig) {
		t.Errorf("--load without a configuration: got %v, want ErrConfig", err)
	}
}

// Default SLOs follow the unloaded TTFT; an --slo-ms that misses a
// priority of the mix, or names one it lacks, is refused.
func TestSLOTargets(t *testing.T) {
	c := Config{Global: &GlobalReplay{Priorities: []Share{{"1", 0.3}, {"0", 0.7}}}}
	got, err := c.sloTargets(100.2)
	if err != nil || !cmp.Equal(got, map[int]float64{1: 201, 0: 1002}) {
		t.Errorf("defaults %v, %v", got, err)
	}
	for _, bad := range []map[int]float64{{1: 500}, {1: 500, 0: 5000, 2: 1}} {
		c.SLOMS = bad
		if _, err := c.sloTargets(100); err == nil {
			t.Errorf("slo %v: no error", bad)
		}
	}
	if got, err := (Config{}).sloTargets(10); err != nil || !cmp.Equal(got, map[int]float64{0: 20}) {
		t.Errorf("no mix: %v, %v", got, err)
	}
}

func TestJainIndex(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{0, 0}, 0}, {[]float64{1, 1, 1, 1}, 1}, {[]float64{1, 0, 0, 0}, 0.25}, {[]float64{0.5, 0.5}, 1}} {
		if got := JainIndex(c.xs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("JainIndex(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestParseSLOAndLoad(t *testing.T) {
	got, err := ParseSLO("1=500, 0=5000")
	if err != nil || !cmp.Equal(got, map[int]float64{1: 500, 0: 5000}) {
		t.Fatalf("ParseSLO = %v, %v", got, err)
	}
	for _, bad := range []string{"", "1", "x=5", "1=0", "1=-3", "1=Inf", "1=NaN", "1=5,1=6", "1=5ms"} {
		if _, err := ParseSLO(bad); err == nil || !strings.Contains(err.Error(), "slo") {
			t.Errorf("ParseSLO(%q): %v", bad, err)
		}
	}
	for in, want := range map[string]float64{"2": 2, "0.7": 0.7, "2x": 2} {
		if got, err := ParseLoad(in); err != nil || got != want {
			t.Errorf("ParseLoad(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0", "-1", "x", "Inf", "NaN"} {
		if _, err := ParseLoad(bad); err == nil || !strings.Contains(err.Error(), "load") {
			t.Errorf("ParseLoad(%q): %v", bad, err)
		}
	}
}

func FuzzParseSLO(f *testing.F) {
	for _, s := range []string{"1=500,0=5000", "", "=", "1=1e309", "-5=1,5=2", "1=5,,2=3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseSLO(s)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("ParseSLO(%q): error %v is not ErrConfig", s, err)
			}
			return
		}
		for p, v := range m {
			if !(v > 0) || math.IsInf(v, 0) {
				t.Fatalf("ParseSLO(%q): priority %d target %v", s, p, v)
			}
		}
	})
}

func FuzzParseLoad(f *testing.F) {
	for _, s := range []string{"2", "0.7x", "", "x", "1e400"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		x, err := ParseLoad(s)
		if err == nil && (!(x > 0) || math.IsInf(x, 0)) {
			t.Fatalf("ParseLoad(%q) = %v", s, x)
		}
	})
}

func FuzzParseShares(f *testing.F) {
	for _, s := range []string{"a=4,b=1,c=1,d=1", "1=0.3,0=0.7", "", "a", "a=1,a=2", "a=NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		shares, err := ParseShares("--tenant-mix", s)
		if err != nil {
			if !strings.Contains(err.Error(), "--tenant-mix") {
				t.Fatalf("ParseShares(%q): error %v does not name the flag", s, err)
			}
			return
		}
		for _, sh := range shares {
			if sh.Value == "" || !(sh.Weight > 0) || math.IsInf(sh.Weight, 0) {
				t.Fatalf("ParseShares(%q): share %+v", s, sh)
			}
		}
	})
}

// TestMaxMinShares: water-filling meets the small demands in full and
// splits the rest equally: the a=4,b=c=d=1 at half its demand
// (3.5 of 7) gives each 0.875 (every demand is above the level); at 5,
// b, c, d theirs and a the 2 left.
func TestMaxMinShares(t *testing.T) {
	for _, c := range []struct {
		demands []float64
		total   float64
		want    []float64
	}{
		{[]float64{4, 1, 1, 1}, 3.5, []float64{0.875, 0.875, 0.875, 0.875}},
		{[]float64{4, 1, 1, 1}, 5, []float64{2, 1, 1, 1}},
		{[]float64{4, 1, 1, 1}, 2, []float64{0.5, 0.5, 0.5, 0.5}},
		{[]float64{4, 1, 1, 1}, 10, []float64{4, 1, 1, 1}},
		{[]float64{3, 0, 6}, 6, []float64{3, 0, 3}},
		{nil, 5, []float64{}},
	} {
		got := MaxMinShares(c.demands, c.total)
		if len(got) != len(c.want) {
			t.Fatalf("MaxMinShares(%v, %v) = %v, want %v", c.demands, c.total, got, c.want)
		}
		for i := range got {
			if math.Abs(got[i]-c.want[i]) > 1e-12 {
				t.Errorf("MaxMinShares(%v, %v) = %v, want %v", c.demands, c.total, got, c.want)
				break
			}
		}
	}
}
