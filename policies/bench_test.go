package policies_test

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/lib/config"
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

// BenchmarkSLOChain runs slo-grid and priority before disaggregate over
// five pools.
func BenchmarkSLOChain(b *testing.B) {
	r := policies.NewRegistry()
	if err := policies.RegisterBuiltins(r); err != nil {
		b.Fatal(err)
	}
	args := func(text string) policies.Section {
		doc, err := config.ParseFile("bench.yaml", []byte(text))
		if err != nil {
			b.Fatal(err)
		}
		return policies.Section{File: "bench.yaml", Node: doc.Content[0]}
	}
	chain, err := r.Build([]policies.Spec{
		{Name: "model-match"}, {Name: "cost"},
		{Name: "slo-grid", Args: args("prefill: {isl_buckets: [1024, 8192], ttft_ms_buckets: [200, 1000], pools: [[pf, pf, pb], [pf, pb, pb], [[pf, pb], pb, pb]]}\ndecode: {itl_ms_buckets: [30], pools: [[df, ds]]}\n")},
		{Name: "priority", Args: args("tiers: [{min_priority: 10, pools: [vip], exclusive: true}]\nshed: {max_priority: -1, max_prefill_tokens: 32768}\n")},
		{Name: "disaggregate"},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	cands := []policies.Candidate{
		cand("pf", policies.RolePrefill, 0, 16, 5, 2000),
		cand("pb", policies.RolePrefill, 0, 64, 2, 2000),
		cand("df", policies.RoleDecode, 0, 16, 10, 2000),
		cand("ds", policies.RoleDecode, 3, 16, 4, 1952),
		cand("vip", policies.RoleDecode, 0, 16, 1, 2000),
	}
	req := &policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{TTFT: 300 * time.Millisecond, ITL: 20 * time.Millisecond}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chain.Rank(req, cands, nil); err != nil {
			b.Fatal(err)
		}
	}
}
