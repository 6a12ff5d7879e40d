package sim

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/mocker"
)

func TestWorkerTimings(t *testing.T) {
	file := mocker.Curves{PrefillMS: mocker.Poly2{Linear: 0.02, Constant: 10}, DecodeMS: mocker.Poly2{Constant: 8}, Speedup: 2}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []mocker.Curves
	}{
		{"matched", Config{Workers: 2}, []mocker.Curves{mocker.DefaultCurves(), mocker.DefaultCurves()}},
		{"speeds and speedup, noise aside", Config{Workers: 2, Speedup: 2, Engines: EngineProfile{Speeds: []float64{1, 0.5}, Noise: 0.2}},
			[]mocker.Curves{withSpeedup(mocker.DefaultCurves(), 2), withSpeedup(mocker.DefaultCurves(), 1)}},
		{"a file's curves, its own speedup kept", Config{Workers: 2, Engines: EngineProfile{Speeds: []float64{1, 0.5}, Timing: &file}},
			[]mocker.Curves{withSpeedup(file, 2), withSpeedup(file, 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.cfg.WorkerTimings()
			if len(got) != len(tc.want) {
				t.Fatalf("%d timings, want %d", len(got), len(tc.want))
			}
			for i, g := range got {
				if c, ok := g.(mocker.Curves); !ok || c != tc.want[i] {
					t.Errorf("worker %d: %+v, want %+v", i, g, tc.want[i])
				}
			}
		})
	}
}

func withSpeedup(c mocker.Curves, s float64) mocker.Curves { c.Speedup = s; return c }

// spacedTrace is n one-block prompts far apart in time: each runs alone.
func spacedTrace(t *testing.T, n int) *Trace {
	var lines []string
	for i := range n {
		lines = append(lines, mooncakeLine(i*5000, 4, 1000+i, 2000+i))
	}
	return loadTestTrace(t, lines)
}

func TestEngineSpeedsSlowTheirWorkers(t *testing.T) {
	cfg := Config{Trace: spacedTrace(t, 8), Workers: 2, Policies: []Policy{{Name: KindRoundRobin, Kind: KindRoundRobin}},
		Engines: EngineProfile{Speeds: []float64{1, 0.5}}}
	rep, err := Run(testContext(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	busy := rep.Results[0].BusySeconds
	if r := busy[1] / busy[0]; r < 1.999 || r > 2.001 {
		t.Errorf("busy seconds %v: the half-speed worker computed %.4f× as long, want 2×", busy, r)
	}
	if got := rep.Engines.Name; got != "speeds=1,0.5 scrape=500ms+0s" {
		t.Errorf("engine profile name %q", got)
	}
}

func TestEngineNoiseIsDeterministicBySeed(t *testing.T) {
	base := Config{Trace: randomTrace(t, 120, 3), Workers: 4, KVTokens: 4096, Rate: 3, Seed: 7,
		Policies: []Policy{KVGate(), Dynamo(), LLMD()}}
	report := func(cfg Config) string {
		rep, err := Run(testContext(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		rep.Replay = ReplayStats{}
		var b bytes.Buffer
		if err := rep.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	quiet := report(base)
	noisy := base
	noisy.Engines.Noise = 0.2
	first, second := report(noisy), report(noisy)
	if first != second {
		t.Error("same seed and noise, different reports")
	}
	if first == quiet {
		t.Error("20 % noise changed nothing")
	}
	noisy.Seed = 8
	if report(noisy) == first {
		t.Error("another seed drew the same noise")
	}
	if !strings.Contains(first, `"noise": 0.2`) {
		t.Error("the JSON report does not name the noise")
	}
}

// Chains that read engine signals replay identically without scrapes
// (none has a signal) and differently with them.
func TestScrapesFeedEngineSignals(t *testing.T) {
	pols, err := ParsePolicies("chain:waiting=1,chain:kv-usage=1,chain:running=1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Trace: randomTrace(t, 200, 5), Workers: 4, KVTokens: 8192, Rate: 6, Seed: 1, Policies: pols}
	results := func(cfg Config) []string {
		rep, err := Run(testContext(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rep.Results {
			r.Policy = ""
			var b bytes.Buffer
			if err := (&Report{Results: []*Result{r}}).WriteJSON(&b); err != nil {
				t.Fatal(err)
			}
			out = append(out, b.String())
		}
		return out
	}
	off := cfg
	off.Engines.ScrapePeriod = -1
	r := results(off)
	if r[0] != r[1] || r[1] != r[2] {
		t.Error("without scrapes, waiting, kv-usage and running chains should see no signal and replay alike")
	}
	for _, delay := range []time.Duration{0, 200 * time.Millisecond} {
		on := cfg
		on.Engines.ScrapePeriod, on.Engines.ScrapeDelay = 100*time.Millisecond, delay
		r := results(on)
		if r[0] == r[1] && r[1] == r[2] {
			t.Errorf("delay %v: with scrapes the three chains still replay alike", delay)
		}
	}
}

func TestLLMDKeepsPrefixesTogether(t *testing.T) {
	if p, err := ParsePolicy("llm-d"); err != nil || p.Kind != KindLLMD {
		t.Fatalf("ParsePolicy(llm-d) = %+v, %v", p, err)
	}
	// Four long shared prefixes, requests far apart (no load): llm-d's
	// prefix scorer (weight 3) sends each prefix back where it went first.
	var lines []string
	for i := range 40 {
		p := (i % 4) * 100
		lines = append(lines, mooncakeLine(i*3000, 4, p, p+1, p+2, p+3, 5000+i))
	}
	cfg := Config{Trace: loadTestTrace(t, lines), Workers: 4, Seed: 1, Policies: []Policy{LLMD(), {Name: KindRoundRobin, Kind: KindRoundRobin}}}
	rep, err := Run(testContext(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	llmd, rr := rep.Results[0], rep.Results[1]
	if llmd.HitVsOracle < 0.999 {
		t.Errorf("llm-d hit ratio %.3f of the oracle, want every shared prefix hit (round-robin: %.3f)", llmd.HitVsOracle, rr.HitVsOracle)
	}
}

func TestEngineProfileValidation(t *testing.T) {
	tr := spacedTrace(t, 2)
	for _, p := range []EngineProfile{
		{Speeds: []float64{1}},
		{Speeds: []float64{1, 0}},
		{Noise: 1},
		{Noise: -0.1},
		{ScrapeDelay: -time.Second},
		{Timing: &mocker.Curves{PrefillMS: mocker.Poly2{Constant: -1}, DecodeMS: mocker.Poly2{Constant: 1}}, TimingName: "bad.yaml"},
	} {
		if err := (Config{Trace: tr, Workers: 2, Engines: p}).Validate(); err == nil {
			t.Errorf("profile %+v accepted", p)
		}
	}
	for _, bad := range []string{"", "1,,1", "1,-1", "x", "1,inf"} {
		if _, err := ParseEngineSpeeds(bad); err == nil {
			t.Errorf("ParseEngineSpeeds(%q) accepted", bad)
		}
	}
}
