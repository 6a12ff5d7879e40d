package policies_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
)

// probe is a pool's probe with isl prompt tokens, overlap cached blocks of
// 16, queued prefill tokens ahead of the request, and active decode blocks
// besides the request's.
func probe(pool string, role policies.Role, isl, overlap, queued, decodeBlocks int) policies.Candidate {
	sel := routing.Selection{WorkerID: pool + "-w", ISL: isl, OverlapBlocks: overlap, BlockSize: 16, RequestBlocks: isl / 16}
	sel.PrefillTokens = queued + sel.UncachedTokens()
	sel.DecodeBlocks = decodeBlocks + sel.RequestBlocks
	return policies.Candidate{Pool: pool, Role: role, Models: []string{"m"}, Weight: 1, Probe: sel}
}

// TestDisaggregateConditional: the decision by prompt length, cache overlap
// and the two pools' load, and its explanation.
func TestDisaggregateConditional(t *testing.T) {
	tests := []struct {
		name   string
		args   string
		pre    policies.Candidate
		dec    policies.Candidate
		remote bool
		why    string
	}{
		{"idle pools, long uncached prompt", "", probe("pre", policies.RolePrefill, 4096, 0, 0, 0), probe("dec", policies.RoleDecode, 4096, 0, 0, 0),
			true, "remote wait 4096 tokens (queue 0 + uncached 4096 on pre) vs local wait 4096 (queue 0 + uncached 4096 on dec): prefill on pre"},
		{"cached on the decode worker", "", probe("pre", policies.RolePrefill, 4096, 0, 0, 0), probe("dec", policies.RoleDecode, 4096, 240, 0, 0),
			false, "uncached 256 tokens on dec < threshold_tokens 512: prefill locally"},
		{"short prompt", "min_isl_tokens: 8192", probe("pre", policies.RolePrefill, 4096, 0, 0, 0), probe("dec", policies.RoleDecode, 4096, 0, 0, 0),
			false, "prompt 4096 tokens < min_isl_tokens 8192: prefill locally"},
		{"prefill pool backed up", "max_prefill_queue_tokens: 10000", probe("pre", policies.RolePrefill, 4096, 0, 20000, 0), probe("dec", policies.RoleDecode, 4096, 0, 0, 0),
			false, "prefill queue 20000 tokens on pre > max_prefill_queue_tokens 10000: prefill locally"},
		{"prefill queue longer than the local wait", "", probe("pre", policies.RolePrefill, 4096, 0, 6000, 0), probe("dec", policies.RoleDecode, 4096, 0, 1000, 0),
			false, "remote wait 10096 tokens (queue 6000 + uncached 4096 on pre) vs local wait 5096 (queue 1000 + uncached 4096 on dec): prefill locally"},
		{"prefill worker caches more", "", probe("pre", policies.RolePrefill, 4096, 200, 2000, 0), probe("dec", policies.RoleDecode, 4096, 0, 0, 0),
			true, "remote wait 2896 tokens (queue 2000 + uncached 896 on pre) vs local wait 4096"},
		{"busy decode worker, weighed", "decode_weight: 0.5", probe("pre", policies.RolePrefill, 4096, 0, 6000, 0), probe("dec", policies.RoleDecode, 4096, 0, 1000, 800),
			true, "local wait 11496 (queue 1000 + uncached 4096 on dec + decode_weight 0.5 × 12800 active decode tokens): prefill on pre"},
		{"threshold only", "load_aware: false", probe("pre", policies.RolePrefill, 4096, 0, 6000, 0), probe("dec", policies.RoleDecode, 4096, 0, 1000, 0),
			true, "uncached 4096 tokens on dec ≥ threshold_tokens 512: prefill on pre"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := build(t, "disaggregate", tt.args, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Rank(&policies.Request{Model: "m", ISL: 4096}, []policies.Candidate{tt.pre, tt.dec})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Pool != "dec" {
				t.Fatalf("ranked %v, want [dec]", pools(got))
			}
			if remote := got[0].Prefill != nil; remote != tt.remote {
				t.Errorf("disaggregated: got %v, want %v (%s)", remote, tt.remote, got[0].Disaggregation)
			}
			if !strings.Contains(got[0].Disaggregation, tt.why) {
				t.Errorf("why: got %q, want it to contain %q", got[0].Disaggregation, tt.why)
			}
		})
	}
	// Only the paths the P/D sidecar splits are disaggregated.
	p, _ := build(t, "disaggregate", "", nil)
	for path, remote := range map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "": true, "/v1/responses": false, "/v1/messages": false} {
		got, _ := p.Rank(&policies.Request{Model: "m", ISL: 4096, Path: path},
			[]policies.Candidate{probe("pre", policies.RolePrefill, 4096, 0, 0, 0), probe("dec", policies.RoleDecode, 4096, 0, 0, 0)})
		if (got[0].Prefill != nil) != remote || (!remote && !strings.Contains(got[0].Disaggregation, "not split by the P/D sidecar")) {
			t.Errorf("path %q: disaggregated %v (%s), want %v", path, got[0].Prefill != nil, got[0].Disaggregation, remote)
		}
	}
	// A sidecar that splits more paths says so in split_paths.
	wide, err := build(t, "disaggregate", `split_paths: [/v1/chat/completions, /v1/responses]`, nil)
	if err != nil {
		t.Fatal(err)
	}
	for path, remote := range map[string]bool{"/v1/responses": true, "/v1/completions": false} {
		got, _ := wide.Rank(&policies.Request{Model: "m", ISL: 4096, Path: path},
			[]policies.Candidate{probe("pre", policies.RolePrefill, 4096, 0, 0, 0), probe("dec", policies.RoleDecode, 4096, 0, 0, 0)})
		if (got[0].Prefill != nil) != remote {
			t.Errorf("split_paths, path %q: disaggregated %v (%s), want %v", path, got[0].Prefill != nil, got[0].Disaggregation, remote)
		}
	}
	// Without a prefill pool the reason says so.
	got, _ := p.Rank(&policies.Request{Model: "m", ISL: 4096}, []policies.Candidate{probe("dec", policies.RoleDecode, 4096, 0, 0, 0)})
	if got[0].Prefill != nil || !strings.Contains(got[0].Disaggregation, "no prefill pool reachable") {
		t.Errorf("no prefill pool: got prefill %v, why %q", got[0].Prefill, got[0].Disaggregation)
	}
}

func TestDisaggregateArgsRefused(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"min_isl_tokens: -1", "min_isl_tokens: got -1"},
		{"max_prefill_queue_tokens: -5", "max_prefill_queue_tokens: got -5"},
		{"decode_weight: -1", "decode_weight: got -1"},
		{"load_aware: maybe", "`maybe` into bool"},
		{"queue: 3", "queue"},
		{"split_paths: [v1/responses]", `split_paths[0]: got "v1/responses"`},
	} {
		_, err := build(t, "disaggregate", tc.args, nil)
		if err == nil || !errors.Is(err, policies.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an ErrConfig naming %q", tc.args, err, tc.want)
		}
	}
}
