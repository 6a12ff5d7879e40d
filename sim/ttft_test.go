package sim

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

func TestParseTTFTPolicies(t *testing.T) {
	got, err := ParsePolicies("ttft, ttft:ext=0.5,dynamo,kvgate,kvgate-cost,kvgate-r1,ttft:ext=auto")
	if err != nil {
		t.Fatal(err)
	}
	want := []Policy{TTFT(1), {Name: "ttft:ext=0.5", Kind: KindTTFT, Externality: 0.5}, Dynamo(), KVGate(), KVGateCost(), KVGateRound1(), {Name: "ttft:ext=auto", Kind: KindTTFT, ExtAuto: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePolicies (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"ttft:ext=-1", "ttft:ext", "ttft:credit=2", "ttft:ext=NaN", "ttft:ext=Inf"} {
		if _, err := ParsePolicies(bad); err == nil {
			t.Errorf("ParsePolicies(%q) accepted", bad)
		}
	}
}

// FuzzParsePolicies: any list is parsed into valid policies or refused with
// ErrConfig, never a panic.
func FuzzParsePolicies(f *testing.F) {
	for _, s := range []string{"kvgate", "kvgate-oracle,kvgate-static", "ttft:ext=1,calib=oracle", "ttft:calib=", "ttft:ext=2,dynamo", "cost:credit=2,scale=766,temp=0.1,tiers=0", "ttft:ext=", ",,", "cost:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParsePolicies(s)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("ParsePolicies(%q): %v, not ErrConfig", s, err)
			}
			return
		}
		for _, p := range ps {
			if err := p.validate(); err != nil {
				t.Fatalf("ParsePolicies(%q) returned invalid %+v: %v", s, p, err)
			}
		}
	})
}

func TestParseCalibrationPolicies(t *testing.T) {
	got, err := ParsePolicies("kvgate,kvgate-static,kvgate-oracle,kvgate-hist,ttft:ext=1,calib=static")
	if err != nil {
		t.Fatal(err)
	}
	want := []Policy{KVGate(), KVGateStatic(), KVGateOracle(), KVGateHist(), {Name: "ttft:ext=1,calib=static", Kind: KindTTFT, Externality: 1, Calibration: CalibrationStatic}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePolicies (-want +got):\n%s", diff)
	}
	if _, err := ParsePolicies("ttft:calib=sometimes"); !errors.Is(err, ErrConfig) {
		t.Errorf("calib=sometimes: %v, want ErrConfig", err)
	}
	for _, tc := range []struct {
		p         Policy
		calibrate bool
	}{{KVGate(), true}, {KVGateStatic(), false}, {KVGateOracle(), false}, {KVGateHist(), true}, {Dynamo(), false}} {
		if got := tc.p.routerConfig(16, 0).Calibrate; got != tc.calibrate {
			t.Errorf("%s: Calibrate %v, want %v", tc.p.Name, got, tc.calibrate)
		}
	}
}

// kvgate-oracle pins each worker's engine timing on its router, read off
// the engine's own IterationTime; the others pin nothing.
func TestOraclePinsEngineTiming(t *testing.T) {
	cfg := Config{BlockSize: 16, Workers: 2, Speedup: 0.5}.withDefaults()
	for _, p := range []Policy{KVGateOracle(), KVGate()} {
		rt, err := localrouter.New(p.routerConfig(16, 0), localrouter.Options{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		pool := &simPool{router: rt}
		for i := range 2 {
			w := &worker{index: i, key: localrouter.WorkerKey{ID: "w" + strconv.Itoa(i)}}
			rt.AddWorker(w.key.ID, 1)
			pool.workers = append(pool.workers, w)
		}
		if err := p.pinOracle(pool, engineTimings(cfg), cfg.MaxNumBatchedTokens); err != nil {
			t.Fatal(err)
		}
		c := rt.CalibrationOf(localrouter.WorkerKey{ID: "w1"})
		if c.Pinned != (p.Calibration == CalibrationOracle) {
			t.Fatalf("%s: pinned %v", p.Name, c.Pinned)
		}
		if !c.Pinned {
			continue
		}
		// Twice as slow as the shipped curves, to the nanosecond the
		// engine rounds its iterations to.
		for _, tok := range []int{100, 4096, 8192} {
			if got, want := c.Model.Prefill(tok), 2*mocker.PrefillMillis(tok); math.Abs(got-want) > 1e-5 {
				t.Errorf("oracle prefill(%d) = %v ms, want %v", tok, got, want)
			}
		}
		if got, want := c.Model.Decode(0.5), 2*mocker.DecodeMillis(0.5); math.Abs(got-want) > 1e-5 {
			t.Errorf("oracle decode(0.5) = %v ms, want %v", got, want)
		}
	}
	if err := KVGateOracle().pinOracle(&simPool{workers: []*worker{{index: 5}}}, engineTimings(cfg), 8192); !errors.Is(err, ErrConfig) {
		t.Errorf("a worker without a timing: %v, want ErrConfig", err)
	}
}

// The TTFT figures leave out the first tenth of the requests, and the
// report says how many.
func TestTTFTWarmup(t *testing.T) {
	tr := randomTrace(t, 100, 3)
	rep, err := Run(testContext(t), Config{Trace: tr, Seed: 1, Workers: 2, Policies: []Policy{KVGate(), KVGateStatic(), KVGateOracle(), KVGateHist()}, KVTokens: 4096, Rate: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.WarmupRequests != 10 {
		t.Errorf("warm-up %d requests, want 10", rep.WarmupRequests)
	}
	for _, r := range rep.Results {
		if r.Completed != 100 || len(r.ttfts) != 90 {
			t.Errorf("%s: %d completed, %d TTFTs counted; want 100 and 90", r.Policy, r.Completed, len(r.ttfts))
		}
	}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "TTFT columns leave out a warm-up: the first 10 requests") {
		t.Errorf("the table does not say the warm-up is left out:\n%s", b.String())
	}
}

// The ttft policies' chain is the local router's scorer, given the
// engines' chunk and KV capacity and the shipped curves, and valid.
func TestTTFTChainIsTheRoutersScorer(t *testing.T) {
	cfg := Config{BlockSize: 16}.withDefaults()
	for _, p := range []Policy{KVGate(), TTFT(0.5)} {
		specs := p.ttftChain(cfg)
		if err := localrouter.ValidateWorkerChain(specs, localrouter.DefaultConfig()); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		if got := specs[1].Args["prefill_ms"]; got != strconv.FormatFloat(mocker.PrefillMillis(8192), 'g', -1, 64) {
			t.Errorf("%s: prefill_ms %s, want the mocker's at 8192 tokens", p.Name, got)
		}
	}
	if got := KVGate().ttftChain(cfg)[1].Args["ext"]; got != "1" {
		t.Errorf("kvgate ext %q, want 1 (the library default)", got)
	}
	if got := KVGateAuto().ttftChain(cfg)[1].Args["ext"]; got != "auto" {
		t.Errorf("kvgate-auto ext %q, want auto", got)
	}
}
