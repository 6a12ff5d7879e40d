package globalrouter_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/policies"
)

// FuzzParseConfig feeds the configuration decoder arbitrary YAML: it must
// never panic, every error must be a configuration error, and what it
// accepts must validate again.
func FuzzParseConfig(f *testing.F) {
	for _, p := range []string{"../examples/pools.yaml", "../examples/pools-disaggregated.yaml", "../examples/pools-slo.yaml", "../examples/pools-tenancy.yaml"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"pools: [{name: a, models: [m], routers: {static: [\"h:1\"]}, policy: {cost: {scale: 2}}}]\nchain: [cost]\n",
		"chain: [{name: disaggregate, args: {threshold_tokens: 1}}]\npools: [{name: a, role: decode, models: [m], routers: {etcd: true}}]\n",
		"pools: &x [{name: a, models: [m], routers: {etcd: true}}]\nmodels: *x\n",
		"probe: {timeout: 1ms, backoff_base: 2s, backoff_max: 1s}\n",
		"pools:\n  - name: a\n    models: [m]\n    routers: {static: [\"h:1\"]}\n    policy: {header-match: {headers: {x: [y]}}}\nchain: [header-match]\n",
		"chain: [{name: slo-grid, args: {default_ttft_ms: 5, prefill: {isl_buckets: [10], ttft_ms_buckets: [1.5], pools: [[a, [a, b]], [b, b]]}}}]\npools: [{name: a, role: prefill, models: [m], routers: {etcd: true}}]\n",
		"chain: [{name: slo-grid, args: {strict: true, decode: {context_length_buckets: [9, 3], pools: [[a], [], [a]]}}}]\npools: [{name: a, models: [m], routers: {etcd: true}}]\n",
		"chain: [{name: priority, args: {tiers: [{min_priority: 1, max_priority: 0, pools: [a], exclusive: true}], shed: {max_priority: 0, max_decode_tokens: 9}}}]\npools: [{name: a, models: [m], routers: {etcd: true}}]\n",
		"trust: {header: X-T, steering: on, routing_headers: trusted, tokens_sha256: [" + strings.Repeat("ab", 32) + "]}\ntenancy: {header: X-Tenant, salt: true}\npools: [{name: a, models: [m], routers: {etcd: true}}]\n",
		"probe: {min_timeout: 5ms, timeout: 1ms, failure_ratio: 2, same_pool_fallbacks: -2}\npools: [{name: a, models: [m], routers: {etcd: true}}]\n",
		"shadow: {chain: [model-match, kv-overlap], log_interval: 1s, max_in_flight: 2}\npools: [{name: a, models: [m], routers: {etcd: true}, policy: {cost: {scale: 2}}}]\nchain: [cost]\n",
		"shadow: {chain: [], max_in_flight: -1}\npools: [{name: a, models: [m], routers: {etcd: true}}]\n",
		"flow_control: {enabled: true, bands: [{name: hi, min_priority: 5, requests: 3}, {name: lo, bytes: 9}], capacity: {requests: 2, bytes: 100}, deadline: 2s, fairness: weighted, weights: {a: 2}, reprobe: 5ms, saturation: {max_prefill_tokens: -1, max_decode_tokens: 8}, max_flow_labels: 3}\npools: [{name: a, models: [m], routers: {etcd: true}}]\n",
		"flow_control: {enabled: true, bands: [{name: a}, {name: a, min_priority: 2}], fairness: x, weights: {a: -1}, deadline: -1s}\npools: [{name: a, models: [m], routers: {etcd: true}}]\n",
		"flow_control: {reprobe: 1s}\npools: [{name: a, models: [m], routers: {etcd: true}}]\n", "flow_control: 3",
		"- 1\n", "{}", "pools: 3", "chain: {a: b}", "shadow: 3",
	} {
		f.Add([]byte(s))
	}
	reg := policies.NewRegistry()
	if err := policies.RegisterBuiltins(reg); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := globalrouter.ParseConfig("fuzz.yaml", data, reg)
		if err != nil {
			var pe *policies.PosError
			if !errors.Is(err, policies.ErrConfig) && !errors.As(err, &pe) && !os.IsNotExist(errors.Unwrap(err)) && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("error is not a configuration error: %v", err)
			}
			return
		}
		if err := cfg.Validate(reg); err != nil {
			t.Fatalf("accepted configuration does not validate again: %v", err)
		}
	})
}

// FuzzReferencedFiles: whatever a configuration file holds, the list of
// files WatchFile watches is read without a panic.
func FuzzReferencedFiles(f *testing.F) {
	f.Add([]byte("pools: [{policy_file: a.yaml}, {policy_file: /abs.yaml}]\nmodels: [{tokenizer: {path: t.json, chat_template: c.jinja}}]\n"))
	f.Add([]byte("pools: 3"))
	f.Add([]byte("models: [{tokenizer: 1}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, p := range globalrouter.ReferencedFiles("dir/c.yaml", data) {
			if p == "" {
				t.Fatal("an empty path")
			}
		}
	})
}
