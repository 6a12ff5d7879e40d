package policies_test

import (
	"testing"

	"github.com/kvgate/kvgate/policies"
)

// TestReads: slo-grid reads the TTFT target with a prefill grid only and
// the ITL target with a decode grid only; priority and session-affinity
// read theirs.
func TestReads(t *testing.T) {
	pre, err := policies.NewSLOGrid(policies.SLOGridArgs{
		Prefill: &policies.PrefillGrid{ISLBuckets: []int{1000}, Pools: [][]policies.Cell{{{"a"}}, {{"b"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := policies.NewSLOGrid(policies.SLOGridArgs{
		Decode: &policies.DecodeGrid{ITLMsBuckets: []float64{5}, Pools: [][]policies.Cell{{{"a"}, {"b"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	one := 1
	pri, err := policies.NewPriority(policies.PriorityArgs{Tiers: []policies.PriorityTier{{MinPriority: &one, Pools: []string{"a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		p    policies.Reader
		want policies.Reads
	}{
		{pre, policies.Reads{TTFT: true}},
		{dec, policies.Reads{ITL: true}},
		{pri, policies.Reads{Priority: true}},
		{policies.SessionAffinity{}, policies.Reads{Session: true}},
	} {
		if got := tt.p.Reads(); got.TTFT != tt.want.TTFT || got.ITL != tt.want.ITL || got.Priority != tt.want.Priority || got.Session != tt.want.Session || len(got.Headers) != 0 {
			t.Errorf("%T: Reads %+v, want %+v", tt.p, got, tt.want)
		}
	}
}
