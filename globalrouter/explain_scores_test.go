package globalrouter

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

func TestFormatScores(t *testing.T) {
	for _, tt := range []struct {
		in   []routing.Score
		want string
	}{
		{nil, ""},
		{[]routing.Score{{Name: "cost", Raw: 412, Weight: 1, Contribution: 412}, {Name: "prefix", Raw: -0.4, Weight: 2, Contribution: -0.8}}, "cost:412.0,prefix:-0.8"},
		{[]routing.Score{{Name: "cold", Contribution: 0.33333333}}, "cold:0.3333"},
	} {
		if got := formatScores(tt.in); got != tt.want {
			t.Errorf("formatScores(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestExplainCreditsTheCost: a winner first in configuration order that the
// cost policy kept first is credited to the cost, with both pools' costs;
// without a cost policy it is configuration order, the costs shown only
// when they agree.
func TestExplainCreditsTheCost(t *testing.T) {
	results := []probeResult{
		{pe: &poolEntry{cfg: pool.Config{Name: "pool-a"}}, sel: routing.Selection{Cost: 28.06}},
		{pe: &poolEntry{cfg: pool.Config{Name: "pool-b"}}, sel: routing.Selection{Cost: 56.06}},
	}
	ranked := []policies.Candidate{{Pool: "pool-a"}, {Pool: "pool-b"}}
	for _, tt := range []struct {
		name  string
		steps []policies.Step
		want  string
	}{
		{"cost kept the first", []policies.Step{{Policy: "model-match", Pools: []string{"pool-a", "pool-b"}}, {Policy: "cost", Pools: []string{"pool-a", "pool-b"}}},
			"cost (cost (lower is better) 28.06 against pool-b 56.06)"},
		{"no cost policy", []policies.Step{{Policy: "model-match", Pools: []string{"pool-a", "pool-b"}}},
			"configuration order (no policy reordered it) (cost (lower is better) 28.06 against pool-b 56.06)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			why := decidedBy(&policies.Trace{Steps: tt.steps}, "pool-a", "pool-a")
			b.WriteString(why)
			writeCostComparison(&b, results, ranked, "pool-a", why == configOrder)
			if b.String() != tt.want {
				t.Errorf("got %q, want %q", b.String(), tt.want)
			}
		})
	}
	// Configuration order against the cost: no comparison claimed.
	var b strings.Builder
	writeCostComparison(&b, results, []policies.Candidate{{Pool: "pool-b"}, {Pool: "pool-a"}}, "pool-b", true)
	if b.String() != "" {
		t.Errorf("order against the cost: got %q, want nothing", b.String())
	}
}
