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

// TestExplainCreditsTheCost: a winner first in configuration order that a
// cost policy kept first, strictly cheaper, is credited to the cost, with
// both pools' costs; a tie, or no cost policy, is configuration order, the
// costs shown only when they agree.
func TestExplainCreditsTheCost(t *testing.T) {
	probe := func(costA, costB float64) []probeResult {
		return []probeResult{
			{pe: &poolEntry{cfg: pool.Config{Name: "pool-a"}}, sel: routing.Selection{Cost: costA}},
			{pe: &poolEntry{cfg: pool.Config{Name: "pool-b"}}, sel: routing.Selection{Cost: costB}},
		}
	}
	withCost := []policies.Step{{Policy: "model-match", Pools: []string{"pool-a", "pool-b"}}, {Policy: "cost", Pools: []string{"pool-a", "pool-b"}}}
	noCost := withCost[:1]
	ranked := []policies.Candidate{{Pool: "pool-a"}, {Pool: "pool-b"}}
	for _, tt := range []struct {
		name    string
		steps   []policies.Step
		results []probeResult
		want    string
	}{
		{"cost kept the first", withCost, probe(28.06, 56.06), ": ranked first by cost (predicted ms added, lower is better): 28.06 against pool-b 56.06"},
		{"a tie is the order", withCost, probe(50.28, 50.28), ": ranked first by configuration order (no policy reordered it)"},
		{"no cost policy, cost agrees", noCost, probe(28.06, 56.06), ": ranked first by configuration order (no policy reordered it); cost (predicted ms added, lower is better) 28.06 against pool-b 56.06"},
		{"no cost policy, cost disagrees", noCost, probe(56.06, 28.06), ": ranked first by configuration order (no policy reordered it)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			tr := &policies.Trace{Steps: tt.steps}
			writeWhy(&b, decidedBy(tr, "pool-a", "pool-a"), tr, tt.results, ranked, "pool-a")
			if b.String() != tt.want {
				t.Errorf("got %q, want %q", b.String(), tt.want)
			}
		})
	}
}
