package sim

import (
	"errors"
	"strconv"
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
	for _, s := range []string{"kvgate", "ttft:ext=2,dynamo", "cost:credit=2,scale=766,temp=0.1,tiers=0", "ttft:ext=", ",,", "cost:"} {
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

// The ttft policies' chain is the local router's scorer, calibrated to
// the simulated engines, and valid.
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
