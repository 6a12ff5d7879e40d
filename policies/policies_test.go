package policies_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/policies"
)

func cand(pool string, role policies.Role, overlap, blockSize int, cost float64, uncached int) policies.Candidate {
	return policies.Candidate{
		Pool: pool, Role: role, Models: []string{"m"}, Weight: 1,
		Probe: routing.Selection{WorkerID: pool + "-w", OverlapBlocks: overlap, BlockSize: blockSize, Cost: cost, ISL: uncached + overlap*blockSize},
	}
}

func pools(cs []policies.Candidate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Pool
		if c.Prefill != nil {
			out[i] += "+" + c.Prefill.Pool
		}
	}
	return out
}

func registry(t *testing.T) *policies.Registry {
	t.Helper()
	r := policies.NewRegistry()
	if err := policies.RegisterBuiltins(r); err != nil {
		t.Fatalf("RegisterBuiltins: %v", err)
	}
	return r
}

// node parses YAML text into a Section of file "test.yaml".
func section(t *testing.T, text string) policies.Section {
	t.Helper()
	doc, err := config.ParseFile("test.yaml", []byte(text))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return policies.Section{File: "test.yaml", Node: doc.Content[0]}
}

// build builds one policy with chain args and per-pool sections given as
// YAML text ("" none).
func build(t *testing.T, name, chainArgs string, poolArgs map[string]string) (policies.Policy, error) {
	t.Helper()
	spec := policies.Spec{Name: name}
	if chainArgs != "" {
		spec.Args = section(t, chainArgs)
	}
	secs := map[string]policies.PoolSection{}
	for p, text := range poolArgs {
		secs[p] = policies.PoolSection{name: section(t, text)}
	}
	c, err := registry(t).Build([]policies.Spec{spec}, secs)
	if err != nil {
		return nil, err
	}
	return c.Policies()[0], nil
}

func TestPolicies(t *testing.T) {
	a := cand("a", policies.RoleAggregated, 2, 16, 10, 100)
	b := cand("b", policies.RoleAggregated, 2, 64, 3, 50)
	c := cand("c", policies.RoleAggregated, 4, 16, 8, 10)
	other := cand("o", policies.RoleAggregated, 9, 16, 1, 0)
	other.Models = []string{"other"}
	wild := cand("w", policies.RoleAggregated, 0, 16, 100, 1000)
	wild.Models = []string{"*"}
	pre := cand("pre", policies.RolePrefill, 0, 16, 1, 2000)
	dec := cand("dec", policies.RoleDecode, 0, 16, 2, 2000)
	decWarm := cand("dec2", policies.RoleDecode, 100, 16, 2, 16)

	tests := []struct {
		name      string
		policy    string
		chainArgs string
		poolArgs  map[string]string
		headers   map[string]string
		tenant    string // the x-tenant the router derived (Request.Tenant)
		in        []policies.Candidate
		want      []string
	}{
		{name: "model-match keeps serving pools and wildcards", policy: "model-match", in: []policies.Candidate{a, other, wild}, want: []string{"a", "w"}},
		{name: "model-match drops all", policy: "model-match", in: []policies.Candidate{other}, want: []string{}},
		{name: "kv-overlap ranks by cached tokens across block sizes", policy: "kv-overlap", in: []policies.Candidate{a, b, c}, want: []string{"b", "c", "a"}},
		{name: "kv-overlap is stable on ties", policy: "kv-overlap", in: []policies.Candidate{cand("x", "aggregated", 1, 16, 0, 0), cand("y", "aggregated", 1, 16, 0, 0)}, want: []string{"x", "y"}},
		// Costs are milliseconds whatever the block size: b's 3 (64-token
		// blocks) beats c's 8 and a's 10 (16-token blocks).
		{name: "cost ranks by cost in ms, not by block size", policy: "cost", in: []policies.Candidate{a, b, c}, want: []string{"b", "c", "a"}},
		{name: "cost scale per pool", policy: "cost", poolArgs: map[string]string{"a": "scale: 4"}, in: []policies.Candidate{a, b, c}, want: []string{"a", "b", "c"}},
		{name: "failover tiers", policy: "failover", poolArgs: map[string]string{"a": "tier: 1", "c": "tier: 2"}, in: []policies.Candidate{c, a, b}, want: []string{"b", "a", "c"}},
		{name: "failover keeps order within a tier", policy: "failover", in: []policies.Candidate{c, a, b}, want: []string{"c", "a", "b"}},
		{name: "header-match requires headers", policy: "header-match", poolArgs: map[string]string{"a": "headers: {x-tenant: [acme]}", "b": "headers: {X-Canary: []}"},
			headers: map[string]string{"x-tenant": "other"}, in: []policies.Candidate{a, b, c}, want: []string{"c"}},
		{name: "header-match value and presence", policy: "header-match", poolArgs: map[string]string{"a": "headers: {x-tenant: [acme]}", "b": "headers: {X-Canary: []}"},
			headers: map[string]string{"x-tenant": "acme", "x-canary": "1"}, in: []policies.Candidate{a, b, c}, want: []string{"a", "b", "c"}},
		{name: "header-match reads the derived tenant, not the header", policy: "header-match", poolArgs: map[string]string{"a": "headers: {x-tenant: [acme]}", "b": "headers: {x-tenant: [other]}"},
			headers: map[string]string{"x-tenant": "other"}, tenant: "acme", in: []policies.Candidate{a, b, c}, want: []string{"a", "c"}},
		{name: "disaggregate pairs long uncached prompts", policy: "disaggregate", chainArgs: "threshold_tokens: 1000", in: []policies.Candidate{pre, dec, a}, want: []string{"dec+pre", "a"}},
		{name: "disaggregate keeps short uncached prompts local", policy: "disaggregate", chainArgs: "threshold_tokens: 1000", in: []policies.Candidate{pre, decWarm}, want: []string{"dec2"}},
		{name: "disaggregate without prefill pool", policy: "disaggregate", in: []policies.Candidate{dec, a}, want: []string{"dec", "a"}},
		{name: "disaggregate default threshold 512", policy: "disaggregate", in: []policies.Candidate{pre, dec}, want: []string{"dec+pre"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := build(t, tt.policy, tt.chainArgs, tt.poolArgs)
			if err != nil {
				t.Fatalf("build: %v", err)
			}
			if p.Name() != tt.policy {
				t.Errorf("Name() = %q, want %q", p.Name(), tt.policy)
			}
			in := append([]policies.Candidate(nil), tt.in...)
			req := &policies.Request{Model: "m", ISL: 2000, Headers: tt.headers}
			if tt.tenant != "" {
				req.TenantHeader, req.Tenant = "x-tenant", tt.tenant
			}
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

func TestChain(t *testing.T) {
	r := registry(t)
	tierB := policies.PoolSection{"failover": policies.SectionOf(policies.FailoverPool{Tier: 1})}
	chain, err := r.Build([]policies.Spec{{Name: "model-match"}, {Name: "kv-overlap"}, {Name: "cost"}, {Name: "failover"}, {Name: "disaggregate"}},
		map[string]policies.PoolSection{"b": tierB})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	in := []policies.Candidate{
		cand("a", policies.RoleAggregated, 0, 16, 50, 800),
		cand("b", policies.RoleAggregated, 0, 16, 1, 800), // cheapest, but tier 1
		cand("c", policies.RoleAggregated, 2, 16, 50, 768),
		cand("p", policies.RolePrefill, 0, 16, 0, 800),
	}
	orig := append([]policies.Candidate(nil), in...)
	var trace policies.Trace
	got, err := chain.Rank(&policies.Request{Model: "m", ISL: 800}, in, &trace)
	if err != nil {
		t.Fatalf("Rank: %v", err)
	}
	// cost ties a and c; kv-overlap (earlier) breaks it for c; failover
	// (last) puts tier 1 last; the prefill pool, unpaired, leaves.
	if diff := cmp.Diff([]string{"c", "a", "b"}, pools(got)); diff != "" {
		t.Errorf("ranking (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(orig, in); diff != "" {
		t.Errorf("Rank modified its input (-want +got):\n%s", diff)
	}
	if got, want := len(trace.Steps), 5; got != want {
		t.Fatalf("trace has %d steps, want %d", got, want)
	}
	if s := trace.String(); !strings.Contains(s, "failover → [p c a b]; disaggregate → [c a b]") {
		t.Errorf("trace = %q, want the failover step", s)
	}

	_, err = chain.Rank(&policies.Request{Model: "nope"}, in, nil)
	if !errors.Is(err, policies.ErrNoCandidate) || !strings.Contains(err.Error(), "model-match") {
		t.Errorf("Rank with an unserved model: got %v, want ErrNoCandidate naming model-match", err)
	}
	_, err = policies.NewChain().Rank(&policies.Request{}, []policies.Candidate{cand("p", policies.RolePrefill, 0, 16, 0, 0)}, nil)
	if !errors.Is(err, policies.ErrNoCandidate) {
		t.Errorf("Rank of a lone prefill pool: got %v, want ErrNoCandidate", err)
	}
}

type nop struct{ name string }

func (n nop) Name() string { return n.name }
func (nop) Rank(_ *policies.Request, c []policies.Candidate) ([]policies.Candidate, error) {
	return c, nil
}

func TestRegistry(t *testing.T) {
	r := registry(t)
	if err := policies.RegisterBuiltins(r); !errors.Is(err, policies.ErrDuplicate) {
		t.Errorf("RegisterBuiltins twice: got %v, want ErrDuplicate", err)
	}
	if err := r.Register("custom", func(policies.Args) (policies.Policy, error) { return nop{"custom"}, nil }); err != nil {
		t.Fatalf("Register: %v", err)
	}
	want := []string{"cost", "custom", "disaggregate", "failover", "header-match", "kv-overlap", "model-match", "priority", "session-affinity", "slo-grid", "weighted"}
	if diff := cmp.Diff(want, r.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	if _, err := r.Build([]policies.Spec{{Name: "custom"}}, nil); err != nil {
		t.Errorf("Build custom: %v", err)
	}
	if policies.NewRegistry().Names() == nil {
		return
	}
	if n := len(policies.NewRegistry().Names()); n != 0 {
		t.Errorf("a new registry has %d policies, want 0 (no init side effects)", n)
	}
}

func TestDecodeStrict(t *testing.T) {
	type inner struct {
		Tier int `yaml:"tier"`
	}
	type outer struct {
		Name  string           `yaml:"name"`
		Items []inner          `yaml:"items"`
		ByKey map[string]inner `yaml:"by_key"`
	}
	tests := []struct {
		name, text, want string
	}{
		{"ok", "name: x\nitems: [{tier: 1}]\nby_key: {a: {tier: 2}}\n", ""},
		{"unknown top", "name: x\nnmae: y\n", `f.yaml:2:1: thing: unknown field "nmae"`},
		{"unknown in list", "items:\n  - tier: 1\n  - teir: 2\n", `f.yaml:3:5: thing.items[1]: unknown field "teir"`},
		{"unknown in map", "by_key:\n  a:\n    tier: 1\n    x: 2\n", `f.yaml:4:5: thing.by_key.a: unknown field "x"`},
		{"type error", "name: x\nitems: [{tier: abc}]\n", "f.yaml:2: thing: cannot unmarshal"},
		{"duplicate key", "name: x\nname: y\n", `f.yaml`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, err := config.ParseFile("f.yaml", []byte(tt.text))
			if err == nil {
				var out outer
				err = config.DecodeStrict("f.yaml", "thing", doc, &out)
			}
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got error %v, want none", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name  string
		specs string // YAML list of chain entries
		pools map[string]string
		want  string
	}{
		{"unknown policy", "- model-match\n- nope\n", nil, `test.yaml:2:3: chain: unknown policy "nope"`},
		{"twice", "- cost\n- cost\n", nil, `test.yaml:2:3: chain: policy "cost" appears twice`},
		{"unknown chain arg", "- name: disaggregate\n  args:\n    threshold: 5\n", nil, `test.yaml:3:5: policy "disaggregate": unknown field "threshold"`},
		{"bad threshold", "- name: disaggregate\n  args: {threshold_tokens: -1}\n", nil, `policy "disaggregate": threshold_tokens: got -1`},
		{"args where none", "- name: cost\n  args: {x: 1}\n", nil, `policy "cost": unknown field "x"`},
		{"unknown entry field", "- name: cost\n  arg: {}\n", nil, `unknown field "arg" in policy entry`},
		{"unknown pool field", "- cost\n", map[string]string{"a": "cost: {scael: 2}"}, `test.yaml:1:8: pool "a": policy "cost": unknown field "scael"`},
		{"bad scale", "- cost\n", map[string]string{"a": "cost: {scale: 0}"}, `pool "a": policy "cost": scale: got 0`},
		{"policy not in chain", "- cost\n", map[string]string{"a": "failover: {tier: 1}"}, `pool "a": policy "failover" is configured but not in the chain`},
		{"unknown pool policy", "- cost\n", map[string]string{"a": "fialover: {tier: 1}"}, `pool "a": unknown policy "fialover"`},
		{"bad tier", "- failover\n", map[string]string{"a": "failover: {tier: -2}"}, `tier: got -2`},
		{"empty header-match", "- header-match\n", map[string]string{"a": "header-match: {headers: {}}"}, `headers: at least one header required`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, err := config.ParseFile("test.yaml", []byte(tt.specs))
			if err != nil {
				t.Fatal(err)
			}
			var specs []policies.Spec
			err = config.DecodeStrict("test.yaml", "chain", doc, &specs)
			if err == nil {
				for i := range specs {
					specs[i].Args.File = "test.yaml"
				}
				secs := map[string]policies.PoolSection{}
				for p, text := range tt.pools {
					pdoc, perr := config.ParseFile("test.yaml", []byte(text))
					if perr != nil {
						t.Fatal(perr)
					}
					var sec policies.PoolSection
					if perr := config.DecodeStrict("test.yaml", "policy", pdoc, &sec); perr != nil {
						t.Fatal(perr)
					}
					sec.SetFile("test.yaml")
					secs[p] = sec
				}
				_, err = registry(t).Build(specs, secs)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
			if !errors.Is(err, policies.ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
		})
	}
}

func TestSectionOf(t *testing.T) {
	s := policies.SectionOf(policies.CostPool{Scale: 2})
	var got policies.CostPool
	if err := s.Decode("x", &got); err != nil {
		t.Fatal(err)
	}
	if got.Scale != 2 {
		t.Errorf("Scale = %v, want 2", got.Scale)
	}
	if !(policies.Section{}).Empty() || !(policies.Section{Node: &yaml.Node{}}).Empty() {
		t.Error("zero sections are not Empty")
	}
}

func TestWeighted(t *testing.T) {
	p, err := build(t, "weighted", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	heavy, light, off := cand("heavy", policies.RoleAggregated, 0, 16, 0, 0), cand("light", policies.RoleAggregated, 0, 16, 0, 0), cand("off", policies.RoleAggregated, 0, 16, 0, 0)
	heavy.Weight, light.Weight, off.Weight = 9, 1, 0
	first := map[string]int{}
	const n = 10000
	for i := range n {
		req := &policies.Request{ID: fmt.Sprint("req-", i)}
		got, err := p.Rank(req, []policies.Candidate{light, off, heavy})
		if err != nil {
			t.Fatal(err)
		}
		first[got[0].Pool]++
		if got[2].Pool != "off" {
			t.Fatalf("a pool of weight 0 ranked %v, want last", pools(got))
		}
		again, _ := p.Rank(req, []policies.Candidate{heavy, off, light})
		if diff := cmp.Diff(pools(got), pools(again)); diff != "" {
			t.Fatalf("request %d ranks differently by input order (-first +second):\n%s", i, diff)
		}
	}
	// 9:1 within a wide margin: the split, not the randomness, is tested.
	if first["heavy"] < n*80/100 || first["heavy"] > n*97/100 {
		t.Errorf("heavy first %d of %d times, want about 90%%", first["heavy"], n)
	}
}

func TestSessionAffinity(t *testing.T) {
	p, err := build(t, "session-affinity", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := cand("a", "aggregated", 0, 16, 0, 0), cand("b", "aggregated", 0, 16, 0, 0), cand("c", "aggregated", 0, 16, 0, 0)
	got, _ := p.Rank(&policies.Request{}, []policies.Candidate{c, a, b})
	if diff := cmp.Diff([]string{"c", "a", "b"}, pools(got)); diff != "" {
		t.Errorf("without a session key the order changed (-want +got):\n%s", diff)
	}
	moved := 0
	for i := range 300 {
		req := &policies.Request{SessionKey: fmt.Sprint("s", i)}
		all, _ := p.Rank(req, []policies.Candidate{a, b, c})
		again, _ := p.Rank(req, []policies.Candidate{c, b, a})
		if all[0].Pool != again[0].Pool {
			t.Fatalf("session %d: first %s then %s", i, all[0].Pool, again[0].Pool)
		}
		// Without pool c, only c's sessions move.
		var rest []policies.Candidate
		for _, x := range []policies.Candidate{a, b, c} {
			if x.Pool != "c" {
				rest = append(rest, x)
			}
		}
		without, _ := p.Rank(req, rest)
		if all[0].Pool != "c" && without[0].Pool != all[0].Pool {
			t.Fatalf("session %d moved from %s to %s when c left", i, all[0].Pool, without[0].Pool)
		}
		if all[0].Pool == "c" {
			moved++
		}
	}
	if moved == 0 || moved == 300 {
		t.Errorf("%d of 300 sessions on c: the hash does not spread", moved)
	}
}
