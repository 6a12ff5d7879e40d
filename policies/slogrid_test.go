package policies_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/policies"
)

// sloGrid is the grid the slo-grid tests use: two prefill pools (pf fast,
// pb bulk) and two decode pools (df fast, ds slow) plus an aggregated pool.
const sloGrid = `prefill:
  isl_buckets: [1024, 8192]
  ttft_ms_buckets: [200, 1000]
  pools:
    - [pf, pf, pb]
    - [pf, pb, pb]
    - [[pf, pb], pb, pb]
decode:
  context_length_buckets: [4096]
  itl_ms_buckets: [30]
  pools:
    - [df, ds]
    - [df, [ds, agg]]
default_ttft_ms: 500
`

// buildKnown builds one policy from chain arguments, with the
// configuration's pools known.
func buildKnown(t *testing.T, name, chainArgs string, known ...string) (policies.Policy, error) {
	t.Helper()
	spec := policies.Spec{Name: name, Args: section(t, chainArgs)}
	c, err := registry(t).Build([]policies.Spec{spec}, nil, policies.KnownPools(known...))
	if err != nil {
		return nil, err
	}
	return c.Policies()[0], nil
}

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

func TestSLOGrid(t *testing.T) {
	pb := cand("pb", policies.RolePrefill, 0, 16, 1, 0)
	pf := cand("pf", policies.RolePrefill, 0, 16, 2, 0)
	ds := cand("ds", policies.RoleDecode, 0, 16, 3, 0)
	df := cand("df", policies.RoleDecode, 0, 16, 4, 0)
	agg := cand("agg", policies.RoleAggregated, 0, 16, 5, 0)
	all := []policies.Candidate{pb, pf, ds, df, agg}

	tests := []struct {
		name     string
		args     string
		isl      int
		ttft     time.Duration
		itl      time.Duration
		in       []policies.Candidate
		wantCell [2][]string
		want     []string
	}{
		{name: "short prompt, tight TTFT; no ITL and no default: middle column", args: sloGrid, isl: 500, ttft: ms(100),
			in: all, wantCell: [2][]string{{"pf"}, {"ds"}}, want: []string{"pf", "ds", "pb", "df", "agg"}},
		{name: "ISL on a threshold falls in the upper row; default TTFT", args: sloGrid, isl: 1024, itl: ms(10),
			in: all, wantCell: [2][]string{{"pb"}, {"df"}}, want: []string{"pb", "df", "pf", "ds", "agg"}},
		{name: "TTFT on a threshold falls in the upper column", args: sloGrid, isl: 100, ttft: ms(1000), itl: ms(29.9),
			in: all, wantCell: [2][]string{{"pb"}, {"df"}}, want: []string{"pb", "df", "pf", "ds", "agg"}},
		{name: "a cell of two pools keeps the chain's order within it", args: sloGrid, isl: 10000, ttft: ms(150), itl: ms(50),
			in: all, wantCell: [2][]string{{"pf", "pb"}, {"ds", "agg"}}, want: []string{"pb", "pf", "ds", "agg", "df"}},
		{name: "the cell's pool is absent: order unchanged", args: sloGrid, isl: 500, ttft: ms(100), itl: ms(10),
			in: []policies.Candidate{pb, ds, agg}, wantCell: [2][]string{{"pf"}, {"df"}}, want: []string{"pb", "ds", "agg"}},
		{name: "strict drops pools outside the cells", args: sloGrid + "strict: true\n", isl: 500, ttft: ms(100), itl: ms(10),
			in: all, wantCell: [2][]string{{"pf"}, {"df"}}, want: []string{"pf", "df"}},
		{name: "strict keeps roles without a grid", args: "strict: true\nprefill: {isl_buckets: [100], pools: [[pf], [pb]]}\n", isl: 500,
			in: all, wantCell: [2][]string{{"pb"}, nil}, want: []string{"pb", "ds", "df", "agg"}},
		{name: "decode grid only: prefill pools keep their order", args: "decode: {itl_ms_buckets: [30], pools: [[ds, df]]}\ndefault_itl_ms: 10\n", isl: 5,
			in: all, wantCell: [2][]string{nil, {"ds"}}, want: []string{"ds", "pb", "pf", "df", "agg"}},
		{name: "default ITL used when the request sets none", args: sloGrid + "default_itl_ms: 100\n", isl: 5000, ttft: ms(5),
			in: all, wantCell: [2][]string{{"pf"}, {"ds", "agg"}}, want: []string{"pf", "ds", "agg", "pb", "df"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := buildKnown(t, "slo-grid", tt.args, "agg", "df", "ds", "pb", "pf")
			if err != nil {
				t.Fatalf("build: %v", err)
			}
			req := &policies.Request{ISL: tt.isl, SLO: policies.SLO{TTFT: tt.ttft, ITL: tt.itl}}
			pre, dec := p.(*policies.SLOGrid).Cells(req)
			if diff := cmp.Diff(tt.wantCell, [2][]string{pre, dec}); diff != "" {
				t.Errorf("cells (-want +got):\n%s", diff)
			}
			in := append([]policies.Candidate(nil), tt.in...)
			got, err := p.Rank(req, in)
			if err != nil {
				t.Fatalf("Rank: %v", err)
			}
			if diff := cmp.Diff(tt.want, pools(got)); diff != "" {
				t.Errorf("ranking (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSLOGridErrors(t *testing.T) {
	tests := []struct {
		name, args, want string
	}{
		{"no grid", "strict: true\n", `test.yaml:1:1: policy "slo-grid": at least one of prefill, decode required`},
		{"unknown field", "prefill:\n  isl_buckets: [1]\n  ttft_buckets: [1]\n", `test.yaml:3:3: policy "slo-grid".prefill: unknown field "ttft_buckets" (known: isl_buckets, pools, ttft_ms_buckets)`},
		{"unsorted rows", "prefill:\n  isl_buckets: [8192, 1024]\n  pools: [[a], [a], [a]]\n", `test.yaml:2:23: policy "slo-grid": prefill.isl_buckets[1]: got 1024, want positive and above the previous threshold`},
		{"duplicate threshold", "decode:\n  itl_ms_buckets: [20, 20]\n  pools: [[a, a, a]]\n", `test.yaml:2:24: policy "slo-grid": decode.itl_ms_buckets[1]: got 20`},
		{"non-positive threshold", "decode: {context_length_buckets: [0], pools: [[a], [a]]}\n", `decode.context_length_buckets[0]: got 0`},
		{"rows", "prefill:\n  isl_buckets: [10]\n  pools: [[a]]\n", `test.yaml:3:10: policy "slo-grid": prefill.pools: got 1 rows, want 2 (one more than isl_buckets)`},
		{"columns", "prefill:\n  ttft_ms_buckets: [10, 20]\n  pools:\n    - [a, b]\n", `test.yaml:4:7: policy "slo-grid": prefill.pools[0]: got 2 cells, want 3 (one more than ttft_ms_buckets)`},
		{"empty cell", "prefill:\n  pools: [[[]]]\n", `test.yaml:2:12: policy "slo-grid": prefill.pools[0][0]: empty cell`},
		{"cell not a name", "prefill:\n  pools: [[{a: b}]]\n", `test.yaml:2:12: cell: a cell is a pool name or a list of pool names`},
		{"duplicate pool in cell", "prefill:\n  pools: [[[a, a]]]\n", `test.yaml:2:16: policy "slo-grid": prefill.pools[0][0]: pool "a" listed twice`},
		{"unknown pool", "decode:\n  pools:\n    - [a, nope]\n  itl_ms_buckets: [5]\n", `test.yaml:3:11: policy "slo-grid": decode.pools[0][1]: no pool "nope" (pools: a, b)`},
		{"negative default", "default_ttft_ms: -1\nprefill: {pools: [[a]]}\n", `test.yaml:1:18: policy "slo-grid": default_ttft_ms: got -1`},
		{"type error", "prefill: {isl_buckets: [x], pools: [[a], [a]]}\n", `test.yaml:1: policy "slo-grid": cannot unmarshal`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := buildKnown(t, "slo-grid", tt.args, "a", "b")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
			if !errors.Is(err, policies.ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
		})
	}
	// Per-pool sections: slo-grid takes none.
	_, err := build(t, "slo-grid", "prefill: {pools: [[a]]}\n", map[string]string{"a": "x: 1"})
	if err == nil || !strings.Contains(err.Error(), `pool "a": policy "slo-grid": unknown field "x"`) {
		t.Errorf("a per-pool section: got %v, want an unknown field error", err)
	}
	// Without KnownPools the names are not checked.
	if _, err := build(t, "slo-grid", "prefill: {pools: [[nope]]}\n", nil); err != nil {
		t.Errorf("pools unknown to Build: got %v, want no error", err)
	}
}

func TestNewSLOGrid(t *testing.T) {
	g, err := policies.NewSLOGrid(policies.SLOGridArgs{
		Prefill: &policies.PrefillGrid{ISLBuckets: []int{1000}, Pools: [][]policies.Cell{{{"a"}}, {{"b", "c"}}}},
	})
	if err != nil {
		t.Fatalf("NewSLOGrid: %v", err)
	}
	pre, _ := g.Cells(&policies.Request{ISL: 1000})
	if diff := cmp.Diff([]string{"b", "c"}, pre); diff != "" {
		t.Errorf("cell (-want +got):\n%s", diff)
	}
	_, err = policies.NewSLOGrid(policies.SLOGridArgs{Decode: &policies.DecodeGrid{ITLMsBuckets: []float64{5}, Pools: [][]policies.Cell{{{"a"}}}}})
	if err == nil || !strings.Contains(err.Error(), "decode.pools[0]: got 1 cells, want 2") {
		t.Errorf("NewSLOGrid of a bad shape: got %v, want a shape error", err)
	}
}

// TestSLOGridChain runs slo-grid before disaggregate: the grid, not the
// cost, picks the prefill and the decode pool.
func TestSLOGridChain(t *testing.T) {
	r := registry(t)
	specs := []policies.Spec{
		{Name: "model-match"},
		{Name: "cost"},
		{Name: "slo-grid", Args: section(t, sloGrid)},
		{Name: "disaggregate", Args: section(t, "threshold_tokens: 512")},
	}
	chain, err := r.Build(specs, nil, policies.KnownPools("pf", "pb", "df", "ds", "agg"))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	pf := cand("pf", policies.RolePrefill, 0, 16, 1, 2000) // cheapest prefill
	pb := cand("pb", policies.RolePrefill, 0, 16, 5, 2000)
	ds := cand("ds", policies.RoleDecode, 0, 16, 2, 2000) // cheapest decode
	df := cand("df", policies.RoleDecode, 0, 16, 10, 2000)
	warm := cand("df", policies.RoleDecode, 120, 16, 10, 80)

	tests := []struct {
		name string
		req  policies.Request
		in   []policies.Candidate
		want []string
	}{
		{"grid picks both halves against the cost", policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{ITL: ms(10)}},
			[]policies.Candidate{pf, pb, ds, df}, []string{"df+pb", "ds+pb"}},
		{"the cell's prefill pool did not answer: next prefill pool", policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{ITL: ms(10)}},
			[]policies.Candidate{pf, ds, df}, []string{"df+pf", "ds+pf"}},
		{"cached prompt on the decode pool: prefill locally", policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{ITL: ms(10)}},
			[]policies.Candidate{pf, pb, ds, warm}, []string{"df", "ds+pb"}},
		{"loose ITL: the slow decode pool", policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{TTFT: ms(50), ITL: ms(100)}},
			[]policies.Candidate{pf, pb, ds, df}, []string{"ds+pf", "df+pf"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var trace policies.Trace
			got, err := chain.Rank(&tt.req, tt.in, &trace)
			if err != nil {
				t.Fatalf("Rank: %v", err)
			}
			if diff := cmp.Diff(tt.want, pools(got)); diff != "" {
				t.Errorf("ranking (-want +got):\n%s\ntrace: %s", diff, &trace)
			}
		})
	}

	strict := append([]policies.Spec(nil), specs...)
	strict[2] = policies.Spec{Name: "slo-grid", Args: section(t, sloGrid+"strict: true\n")}
	sc, err := r.Build(strict, nil)
	if err != nil {
		t.Fatalf("Build strict: %v", err)
	}
	_, err = sc.Rank(&policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{ITL: ms(10)}}, []policies.Candidate{pf, pb, ds}, nil)
	if !errors.Is(err, policies.ErrNoCandidate) {
		t.Errorf("strict grid whose decode pool did not answer: got %v, want ErrNoCandidate", err)
	}
}
