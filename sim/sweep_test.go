package sim

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseSweep(t *testing.T) {
	got, err := ParseSweep("credit=1,2,4; prefill_load_scale=1,8;predicted_ttl=0,2s;chain.disaggregate.threshold_tokens=512,1024")
	if err != nil {
		t.Fatal(err)
	}
	want := []SweepParam{{"credit", []string{"1", "2", "4"}}, {"scale", []string{"1", "8"}}, {"predicted_ttl", []string{"0", "2s"}},
		{"chain.disaggregate.threshold_tokens", []string{"512", "1024"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("ParseSweep (-want +got):\n%s", diff)
	}
	for _, tc := range []struct{ in, part string }{
		{"", `names no parameter`},
		{"credit", `part 1 "credit"`},
		{"credit=1;scale=", `part 2 "scale="`},
		{"credit=1,,2", `empty value`},
		{"credit=-1", `"-1" is not a non-negative number`},
		{"credit=x", `"x"`},
		{"scale=1;scale=2", `swept twice`},
		{"credit=1,1", `listed twice`},
		{"bogus=1", `unknown parameter "bogus"`},
		{"predicted_ttl=fast", `not a duration`},
		{"chain.cost=1", `chain.POLICY.KEY`},
		{"chain..x=1", `chain.POLICY.KEY`},
		{"=1", `part 1`},
	} {
		_, err := ParseSweep(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.part) {
			t.Errorf("ParseSweep(%q) = %v, want an error naming %s", tc.in, err, tc.part)
		}
	}
}

func FuzzParseSweep(f *testing.F) {
	for _, s := range []string{"credit=1,2,4,8;scale=1,4,8", "temp=0,0.5", "predicted_ttl=0,1s", "chain.priority.shed.max_prefill_tokens=1,2", ";;", "credit=1e400", "x=y=z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParseSweep(s)
		if err != nil {
			if !strings.Contains(err.Error(), "sweep") {
				t.Fatalf("error %q does not say it is the sweep's", err)
			}
			return
		}
		n := 1
		for _, p := range ps {
			if p.Name == "" || len(p.Values) == 0 {
				t.Fatalf("parsed %q into an empty parameter %+v", s, p)
			}
			for _, v := range p.Values {
				if err := checkSweepValue(p.Name, v); err != nil {
					t.Fatalf("parsed value %q of %s is invalid: %v", v, p.Name, err)
				}
			}
			n *= len(p.Values)
		}
		if got := len(combinations(ps)); got != n || n > maxSweepPoints {
			t.Fatalf("%d combinations, want %d (≤ %d)", got, n, maxSweepPoints)
		}
	})
}

func TestParetoFront(t *testing.T) {
	pts := []*SweepPoint{
		{MeanTTFT: 10, P99TTFT: 100, HitRatio: 0.5}, // front: best mean
		{MeanTTFT: 20, P99TTFT: 50, HitRatio: 0.5},  // front: best p99
		{MeanTTFT: 30, P99TTFT: 200, HitRatio: 0.9}, // front: best hit
		{MeanTTFT: 20, P99TTFT: 100, HitRatio: 0.5}, // dominated by the first
		{MeanTTFT: 10, P99TTFT: 100, HitRatio: 0.5}, // equal to the first: both stay
	}
	markPareto(pts)
	var got []bool
	for _, p := range pts {
		got = append(got, p.Pareto)
	}
	if want := []bool{true, true, true, false, true}; !cmp.Equal(got, want) {
		t.Fatalf("pareto %v, want %v", got, want)
	}
}

// A flat sweep runs every combination as a cost policy; the points carry
// the results of the same policies run directly.
func TestSweepFlat(t *testing.T) {
	tr := randomTrace(t, 120, 3)
	cfg := Config{Trace: tr, Seed: 2, Workers: 4, KVTokens: 8192, Rate: 4, Parallel: 2}
	params, err := ParseSweep("credit=1,8;scale=1,8")
	if err != nil {
		t.Fatal(err)
	}
	sw, err := Sweep(testContext(t), cfg, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(sw.Points) != 4 {
		t.Fatalf("%d points, want 4", len(sw.Points))
	}
	direct := cfg
	direct.Policies = []Policy{{Name: "x", Kind: KindCost, Credit: 8, Scale: 1}}
	want := runReport(t, direct).Results[0]
	p := sw.Points[2] // credit=8,scale=1
	if strings.Join(p.Params, ",") != "credit=8,scale=1" || p.MeanTTFT != want.TTFTMS.Mean || p.HitRatio != want.HitRatio {
		t.Fatalf("point %v: mean %v hit %v; the policy run directly: mean %v hit %v", p.Params, p.MeanTTFT, p.HitRatio, want.TTFTMS.Mean, want.HitRatio)
	}
	front := 0
	for _, p := range sw.Points {
		if p.Pareto {
			front++
		}
	}
	if front == 0 {
		t.Fatal("empty Pareto front")
	}
	var b bytes.Buffer
	if err := sw.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Pareto front (") || !strings.Contains(b.String(), "credit=8,scale=1") {
		t.Fatalf("table:\n%s", b.String())
	}
	if _, err := Sweep(testContext(t), cfg, []SweepParam{{Name: "chain.cost.x", Values: []string{"1"}}}); err == nil {
		t.Fatal("a chain argument swept without a configuration: no error")
	}
}

// A config sweep sets the routers' parameters and chain arguments: a
// disaggregation threshold above every prompt sends nothing to the
// prefill pool.
func TestSweepConfig(t *testing.T) {
	var lines []string
	next := 1
	for i := range 60 {
		var ids []int
		for range 4 + 26*(i%2) {
			ids = append(ids, next)
			next++
		}
		lines = append(lines, mooncakeLine(i*50, 8, ids...))
	}
	tr := loadTestTrace(t, lines)
	cfg := Config{Trace: tr, Seed: 3, Workers: 4, KVTokens: 1 << 16,
		Global: &GlobalReplay{Config: globalConfig(t, `
chain:
  - model-match
  - cost
  - name: disaggregate
    args: {threshold_tokens: 1024}
pools:
  - {name: prefill, role: prefill, models: [m], routers: {etcd: true}}
  - {name: decode, role: decode, models: [m], routers: {etcd: true}}
`), Name: "d.yaml"}}
	params, err := ParseSweep("chain.disaggregate.threshold_tokens=1024,100000;credit=1")
	if err != nil {
		t.Fatal(err)
	}
	sw, err := Sweep(testContext(t), cfg, params)
	if err != nil {
		t.Fatal(err)
	}
	remote := func(p *SweepPoint) int {
		n := 0
		for _, w := range p.Result.workers {
			if w >= 0 && w < 2 {
				n++
			}
		}
		return n
	}
	if len(sw.Points) != 2 || remote(sw.Points[0]) != 30 || remote(sw.Points[1]) != 0 {
		t.Fatalf("points %d; prefilled remotely: threshold 1024 → %d (want 30), 100000 → %d (want 0)", len(sw.Points), remote(sw.Points[0]), remote(sw.Points[1]))
	}
	if sw.Points[0].Result.Policy != "chain.disaggregate.threshold_tokens=1024,credit=1" {
		t.Errorf("policy label %q", sw.Points[0].Result.Policy)
	}
	bad, _ := ParseSweep("chain.nosuch.x=1")
	if _, err := Sweep(testContext(t), cfg, bad); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Fatalf("unknown chain policy: %v", err)
	}
}
