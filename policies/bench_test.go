package policies_test

import (
	"testing"

	"github.com/kvgate/kvgate/policies"
)

// BenchmarkChain runs the example chain over four pools, as the global
// router does per request.
func BenchmarkChain(b *testing.B) {
	r := policies.NewRegistry()
	if err := policies.RegisterBuiltins(r); err != nil {
		b.Fatal(err)
	}
	chain, err := r.Build([]policies.Spec{{Name: "model-match"}, {Name: "header-match"}, {Name: "kv-overlap"}, {Name: "cost"}, {Name: "failover"}, {Name: "disaggregate"}},
		map[string]policies.PoolSection{"c": {"failover": policies.SectionOf(policies.FailoverPool{Tier: 1})}})
	if err != nil {
		b.Fatal(err)
	}
	cands := []policies.Candidate{
		cand("a", policies.RoleAggregated, 3, 16, 40, 900),
		cand("b", policies.RoleAggregated, 9, 16, 20, 800),
		cand("c", policies.RoleDecode, 0, 16, 10, 1000),
		cand("d", policies.RolePrefill, 0, 64, 5, 1000),
	}
	req := &policies.Request{Model: "m", ISL: 1000}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chain.Rank(req, cands, nil); err != nil {
			b.Fatal(err)
		}
	}
}
