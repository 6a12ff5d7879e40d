package policies_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/policies"
)

const priorityArgs = `tiers:
  - {min_priority: 10, pools: [reserved], exclusive: true}
  - {min_priority: 1, max_priority: 9, pools: [fast]}
shed:
  max_priority: -1
  max_prefill_tokens: 1000
  max_decode_tokens: 16000
`

// loaded returns c with the given potential prefill tokens and decode
// blocks on its best worker.
func loaded(c policies.Candidate, prefillTokens, decodeBlocks int) policies.Candidate {
	c.Probe.PrefillTokens, c.Probe.DecodeBlocks = prefillTokens, decodeBlocks
	return c
}

func TestPriority(t *testing.T) {
	slow := cand("slow", policies.RoleAggregated, 0, 16, 0, 0)
	fast := cand("fast", policies.RoleDecode, 0, 16, 0, 0)
	reserved := cand("reserved", policies.RoleAggregated, 0, 16, 0, 0)
	pre := cand("pre", policies.RolePrefill, 0, 16, 0, 0)
	all := []policies.Candidate{slow, fast, reserved, pre}
	// Loaded by prefill tokens (> 1000), by decode tokens (> 16000 =
	// 1001 blocks × 16), and exactly at the thresholds (not loaded).
	busySlow, busyFast, busyReserved := loaded(slow, 1001, 0), loaded(fast, 0, 1001), loaded(reserved, 5000, 5000)
	atLimit := loaded(fast, 1000, 1000)

	tests := []struct {
		name      string
		priority  int
		in        []policies.Candidate
		want      []string
		saturated bool
	}{
		{name: "default priority: no tier, the reserved pool leaves", priority: 0, in: all, want: []string{"slow", "fast", "pre"}},
		{name: "middle tier: its pool first", priority: 5, in: all, want: []string{"fast", "slow", "pre"}},
		{name: "tier bounds are inclusive", priority: 9, in: all, want: []string{"fast", "slow", "pre"}},
		{name: "high priority: the reserved pool first", priority: 10, in: all, want: []string{"reserved", "slow", "fast", "pre"}},
		{name: "high priority takes the reserved pool even loaded", priority: 12, in: []policies.Candidate{busySlow, busyFast, busyReserved}, want: []string{"reserved", "slow", "fast"}},
		{name: "low priority, every pool loaded: shed", priority: -1, in: []policies.Candidate{busySlow, busyFast, pre}, saturated: true},
		{name: "low priority, the only unloaded pool is reserved: shed", priority: -3, in: []policies.Candidate{busySlow, busyFast, reserved}, saturated: true},
		{name: "low priority, one pool at its threshold: kept", priority: -1, in: []policies.Candidate{busySlow, atLimit}, want: []string{"slow", "fast"}},
		{name: "default priority is above shed.max_priority: kept", priority: 0, in: []policies.Candidate{busySlow, busyFast}, want: []string{"slow", "fast"}},
		{name: "only prefill pools: not shed (the chain answers 503)", priority: -9, in: []policies.Candidate{loaded(pre, 9999, 9999)}, want: []string{"pre"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := buildKnown(t, "priority", priorityArgs, "fast", "pre", "reserved", "slow")
			if err != nil {
				t.Fatalf("build: %v", err)
			}
			in := append([]policies.Candidate(nil), tt.in...)
			got, err := p.Rank(&policies.Request{Priority: tt.priority}, in)
			if tt.saturated {
				if !errors.Is(err, policies.ErrSaturated) {
					t.Fatalf("Rank: got %v, %v, want ErrSaturated", pools(got), err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Rank: %v", err)
			}
			if diff := cmp.Diff(tt.want, pools(got)); diff != "" {
				t.Errorf("ranking (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPriorityErrors(t *testing.T) {
	tests := []struct {
		name, args, want string
	}{
		{"nothing", "{}\n", `test.yaml:1:1: policy "priority": at least one of tiers, shed required`},
		{"unknown field", "tiers:\n  - {min: 1, pools: [a]}\n", `test.yaml:2:6: policy "priority".tiers[0]: unknown field "min" (known: exclusive, max_priority, min_priority, pools)`},
		{"range", "tiers:\n  - min_priority: 5\n    max_priority: 1\n    pools: [a]\n", `test.yaml:3:19: policy "priority": tiers[0]: max_priority 1 is below min_priority 5`},
		{"no pools", "tiers:\n  - {min_priority: 1}\n", `test.yaml:2:5: policy "priority": tiers[0].pools: at least one pool required`},
		{"duplicate pool", "tiers:\n  - {pools: [a, a]}\n", `test.yaml:2:17: policy "priority": tiers[0].pools: pool "a" listed twice`},
		{"unknown pool", "tiers:\n  - {pools: [a, nope]}\n", `test.yaml:2:17: policy "priority": tiers[0].pools[1]: no pool "nope" (pools: a, b)`},
		{"shed without priority", "shed: {max_prefill_tokens: 5}\n", `test.yaml:1:7: policy "priority": shed.max_priority required`},
		{"shed without threshold", "shed: {max_priority: 0}\n", `policy "priority": shed: at least one of max_prefill_tokens, max_decode_tokens required`},
		{"negative threshold", "shed:\n  max_priority: 0\n  max_decode_tokens: -1\n", `test.yaml:3:22: policy "priority": shed.max_decode_tokens: got -1`},
		{"type error", "shed: {max_priority: low, max_prefill_tokens: 5}\n", `test.yaml:1: policy "priority": cannot unmarshal`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := buildKnown(t, "priority", tt.args, "a", "b")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
			if !errors.Is(err, policies.ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
		})
	}
	if _, err := policies.NewPriority(policies.PriorityArgs{Tiers: []policies.PriorityTier{{Pools: []string{"x"}}}}); err != nil {
		t.Errorf("NewPriority: %v", err)
	}
}

// TestPriorityChain: priority and slo-grid before disaggregate. The grid
// picks the pools for the SLO; a high priority overrides it with the
// reserved decode pool (priority runs later, so its key is stronger); a
// low priority is shed when every decode pool is loaded, and the error
// reaches the chain's caller as ErrSaturated (429).
func TestPriorityChain(t *testing.T) {
	chain, err := registry(t).Build([]policies.Spec{
		{Name: "model-match"},
		{Name: "cost"},
		{Name: "slo-grid", Args: section(t, "decode: {itl_ms_buckets: [30], pools: [[df, ds]]}\n")},
		{Name: "priority", Args: section(t, "tiers: [{min_priority: 5, pools: [vip], exclusive: true}]\nshed: {max_priority: -1, max_prefill_tokens: 4000}\n")},
		{Name: "disaggregate"},
	}, nil, policies.KnownPools("pf", "df", "ds", "vip"))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	pf := cand("pf", policies.RolePrefill, 0, 16, 1, 2000)
	df := loaded(cand("df", policies.RoleDecode, 0, 16, 4, 2000), 5000, 0)
	ds := loaded(cand("ds", policies.RoleDecode, 0, 16, 3, 2000), 4500, 0)
	vip := cand("vip", policies.RoleDecode, 0, 16, 9, 2000)
	in := []policies.Candidate{pf, df, ds, vip}

	tests := []struct {
		name string
		req  policies.Request
		want []string
	}{
		{"tight ITL, default priority", policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{ITL: ms(20)}}, []string{"df+pf", "ds+pf"}},
		{"loose ITL, default priority", policies.Request{Model: "m", ISL: 2000, SLO: policies.SLO{ITL: ms(50)}}, []string{"ds+pf", "df+pf"}},
		{"high priority: the reserved pool", policies.Request{Model: "m", ISL: 2000, Priority: 7, SLO: policies.SLO{ITL: ms(20)}}, []string{"vip+pf", "df+pf", "ds+pf"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var trace policies.Trace
			got, err := chain.Rank(&tt.req, in, &trace)
			if err != nil {
				t.Fatalf("Rank: %v", err)
			}
			if diff := cmp.Diff(tt.want, pools(got)); diff != "" {
				t.Errorf("ranking (-want +got):\n%s\ntrace: %s", diff, &trace)
			}
		})
	}
	_, err = chain.Rank(&policies.Request{Model: "m", ISL: 2000, Priority: -1}, in, nil)
	if !errors.Is(err, policies.ErrSaturated) || !strings.Contains(err.Error(), `policy "priority"`) {
		t.Errorf("low priority on loaded pools: got %v, want ErrSaturated naming priority", err)
	}
}
