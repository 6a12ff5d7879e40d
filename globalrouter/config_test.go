package globalrouter_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/tokenizer"
)

func builtins(t testing.TB) *policies.Registry {
	r := policies.NewRegistry()
	if err := policies.RegisterBuiltins(r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestExampleConfigs(t *testing.T) {
	for _, f := range []string{"../examples/pools.yaml", "../examples/pools-disaggregated.yaml", "../examples/pools-tenancy.yaml"} {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cfg, err := globalrouter.LoadConfig(f, builtins(t))
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			if len(cfg.Pools) != 2 {
				t.Errorf("%d pools, want 2", len(cfg.Pools))
			}
		})
	}
	cfg, err := globalrouter.LoadConfig("../examples/pools.yaml", builtins(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := globalrouter.LoadConfig("../examples/pools-tenancy.yaml", builtins(t)); err != nil || cfg.Tenancy.Identity != globalrouter.IdentityXFCC || cfg.Tenancy.XFCC == nil || cfg.Tenancy.XFCC.Prefix != "spiffe://cluster.local/ns/" {
		t.Errorf("examples/pools-tenancy.yaml read as %+v, %v", cfg, err)
	}
	if cfg.Probe.Timeout != 250*time.Millisecond || cfg.Probe.MinTimeout != 25*time.Millisecond || cfg.Trust.Steering != globalrouter.AccessTrusted || len(cfg.Chain) != 6 || cfg.Pools[0].Policy["cost"].File != filepath.Join("..", "examples", "policies", "pool-a.yaml") {
		t.Errorf("examples/pools.yaml read as %+v", cfg)
	}
}

// write writes files into a new folder and returns it.
func write(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const goodPools = `pools:
  - name: pool-a
    models: [m]
    routers: {static: ["127.0.0.1:7101"]}
    policy_file: a.yaml
`

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"unknown top-level field", map[string]string{"c.yaml": "probe: {timeout: 5ms}\npoolz: []\n"}, `c.yaml:2:1: unknown field "poolz"`},
		{"unknown probe field", map[string]string{"c.yaml": "probe:\n  timout: 5ms\n"}, `c.yaml:2:3: probe: unknown field "timout"`},
		{"bad duration", map[string]string{"c.yaml": "probe:\n  timeout: soon\n" + goodPools, "a.yaml": ""}, `c.yaml:2: cannot unmarshal`},
		{"unknown chain policy", map[string]string{"c.yaml": "chain: [model-match, kv-overlapp]\n" + goodPools, "a.yaml": ""}, `c.yaml:1:22: chain: unknown policy "kv-overlapp"`},
		{"bad chain args", map[string]string{"c.yaml": "chain:\n  - name: disaggregate\n    args: {threshold_token: 3}\n" + goodPools, "a.yaml": ""}, `c.yaml:3:12: policy "disaggregate": unknown field "threshold_token"`},
		{"bad pool policy file", map[string]string{"c.yaml": "chain: [cost]\n" + goodPools, "a.yaml": "cost:\n  scale: 2\n  sclae: 1\n"}, `a.yaml:3:3: pool "pool-a": policy "cost": unknown field "sclae"`},
		{"pool policy not in chain", map[string]string{"c.yaml": "chain: [cost]\n" + goodPools, "a.yaml": "failover: {tier: 1}\n"}, `a.yaml:1:11: pool "pool-a": policy "failover" is configured but not in the chain`},
		{"unknown tokenizer field", map[string]string{"c.yaml": "models:\n  - name: m\n    tokenizer: {backend: openai, encodin: x}\n" + goodPools, "a.yaml": ""}, `c.yaml:3:34: models[0].tokenizer: unknown field "encodin"`},
		{"tokenizer for no pool", map[string]string{"c.yaml": "models:\n  - name: z\n    tokenizer: {backend: openai}\n" + goodPools, "a.yaml": ""}, `models: "z" has a tokenizer but no pool serves it`},
		{"bad steering access", map[string]string{"c.yaml": "trust: {steering: maybe}\n" + goodPools, "a.yaml": ""}, `trust.steering "maybe": want off, trusted or on`},
		{"bad token digest", map[string]string{"c.yaml": "trust: {tokens_sha256: [abc]}\n" + goodPools, "a.yaml": ""}, `trust.tokens_sha256[0]: want 64 hex digits`},
		{"salt without tenant header", map[string]string{"c.yaml": "tenancy: {salt: true}\n" + goodPools, "a.yaml": ""}, `tenancy.salt needs tenancy.header`},
		{"salt without tenant header, line", map[string]string{"c.yaml": goodPools + "tenancy:\n  salt: true\n", "a.yaml": ""}, `c.yaml:6:1: invalid policy configuration: tenancy.salt needs tenancy.header`},
		{"bad identity", map[string]string{"c.yaml": "tenancy: {header: x-tenant, identity: mtls}\n" + goodPools, "a.yaml": ""}, `c.yaml:1:1: invalid policy configuration: tenancy.identity "mtls": want trusted, on, xfcc or jwt-claim`},
		{"xfcc without its section", map[string]string{"c.yaml": "tenancy: {header: x-tenant, identity: xfcc}\n" + goodPools, "a.yaml": ""}, `c.yaml:1:1: invalid policy configuration: tenancy.identity xfcc needs tenancy.xfcc`},
		{"xfcc section not read", map[string]string{"c.yaml": "tenancy: {header: x-tenant, xfcc: {san: uri, prefix: spiffe://x/}}\n" + goodPools, "a.yaml": ""}, `tenancy.xfcc is read only with tenancy.identity xfcc (it is trusted)`},
		{"xfcc unknown field", map[string]string{"c.yaml": "tenancy:\n  header: x-tenant\n  identity: xfcc\n  xfcc: {san: uri, prefx: spiffe://x/}\n" + goodPools, "a.yaml": ""}, `c.yaml:4:20: tenancy.xfcc: unknown field "prefx"`},
		{"xfcc bad san", map[string]string{"c.yaml": "tenancy: {header: x-tenant, identity: xfcc, xfcc: {san: email}}\n" + goodPools, "a.yaml": ""}, `tenancy.xfcc.san "email": want uri or dns`},
		{"xfcc dns without a dotted suffix", map[string]string{"c.yaml": "tenancy: {header: x-tenant, identity: xfcc, xfcc: {san: dns, suffix: example.com}}\n" + goodPools, "a.yaml": ""}, `tenancy.xfcc.suffix: san dns needs the suffix after the tenant's label, beginning with a dot`},
		{"jwt without claim", map[string]string{"c.yaml": "tenancy: {header: x-tenant, identity: jwt-claim, jwt: {provider: idp}}\n" + goodPools, "a.yaml": ""}, `tenancy.identity jwt-claim needs tenancy.jwt {provider, claim}`},
		{"jwt without header", map[string]string{"c.yaml": "tenancy: {identity: jwt-claim, jwt: {provider: idp, claim: tenant}}\n" + goodPools, "a.yaml": ""}, `tenancy.identity jwt-claim needs tenancy.header`},
		{"min timeout above timeout", map[string]string{"c.yaml": "probe: {timeout: 10ms, min_timeout: 20ms}\n" + goodPools, "a.yaml": ""}, `probe.min_timeout 20ms is above probe.timeout 10ms`},
		{"bad commit mode", map[string]string{"c.yaml": "probe: {commit: eager}\n" + goodPools, "a.yaml": ""}, `probe.commit "eager": want "decide", "pipelined" or "reserve"`},
		{"flow control unknown field", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  deadlne: 1s\n" + goodPools, "a.yaml": ""}, `c.yaml:3:3: flow_control: unknown field "deadlne"`},
		{"flow control bands out of order", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  bands:\n    - {name: a, min_priority: 1}\n    - {name: b, min_priority: 5}\n    - {name: c}\n" + goodPools, "a.yaml": ""}, `c.yaml:5:31: invalid policy configuration: invalid flow_control: flow_control.bands[1].min_priority: 5: bands go from the highest priority down`},
		{"flow control weights unread", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  weights: {a: 2}\n" + goodPools, "a.yaml": ""}, `flow_control.weights: read only by fairness: weighted`},
		{"objective bad name", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  objectives:\n    - {name: Batch_Jobs, priority: -1}\n" + goodPools, "a.yaml": ""}, `c.yaml:4:14: invalid policy configuration: invalid flow_control: flow_control.objectives[0].name: "Batch_Jobs" is not an InferenceObjective name`},
		{"objectives file field", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  objectives_file: o.yaml\n" + goodPools, "a.yaml": "", "o.yaml": "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: batch}\nspec: {poolRef: {name: p}, criticality: Sheddable}\n"}, `o.yaml:4:28: spec: unknown field "criticality"`},
		{"objectives file missing", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  objectives_file: none.yaml\n" + goodPools, "a.yaml": ""}, `c.yaml:3:20: invalid policy configuration: flow_control.objectives_file: open`},
		{"objective in list and file", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  objectives: [{name: batch}]\n  objectives_file: o.yaml\n" + goodPools, "a.yaml": "", "o.yaml": "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: batch}\nspec: {poolRef: {name: p}}\n"}, `c.yaml:3:16: invalid policy configuration: flow_control.objectives[0]: objective "batch" is also in`},
		{"objective priority not an integer", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  objectives:\n    - {name: batch, priority: 1.5}\n" + goodPools, "a.yaml": ""}, `c.yaml:4:31: invalid policy configuration: flow_control.objectives[0].priority: "1.5" is not an integer`},
		{"inference pool without file", map[string]string{"c.yaml": "flow_control:\n  enabled: true\n  inference_pool: p\n" + goodPools, "a.yaml": ""}, `flow_control.inference_pool: read only with objectives_file`},
		{"trust objectives unread", map[string]string{"c.yaml": "trust: {objectives: trusted}\nflow_control: {enabled: true}\n" + goodPools, "a.yaml": ""}, `trust.objectives is set but flow_control names no objectives`},
		{"trust objectives flow off", map[string]string{"c.yaml": "trust: {objectives: trusted}\n" + goodPools, "a.yaml": ""}, `trust.objectives is set but flow control is off`},
		{"bad objectives access", map[string]string{"c.yaml": "trust: {objectives: anyone}\n" + goodPools, "a.yaml": ""}, `trust.objectives "anyone": want off, trusted or on`},
		{"flow control set but off", map[string]string{"c.yaml": "flow_control:\n  deadline: 2s\n" + goodPools, "a.yaml": ""}, `c.yaml:1:1: invalid policy configuration: flow_control is set but not enabled`},
		{"reserve ttl without reserve", map[string]string{"c.yaml": "probe: {commit: decide, reserve_ttl: 50ms}\n" + goodPools, "a.yaml": ""}, `probe.reserve_ttl 50ms is read only with probe.commit: reserve (probe.commit is "decide")`},
		{"reserve ttl too long", map[string]string{"c.yaml": "probe: {commit: reserve, reserve_ttl: 1m}\n" + goodPools, "a.yaml": ""}, `probe.reserve_ttl 1m0s: want a duration above 0 and at most 10s`},
		{"reserve ttl below a millisecond", map[string]string{"c.yaml": "probe: {commit: reserve, reserve_ttl: 500us}\n" + goodPools, "a.yaml": ""}, `probe.reserve_ttl 500µs: want at least 1ms`},
		{"no pools", map[string]string{"c.yaml": "chain: [cost]\n"}, `no pools`},
		{"syntax", map[string]string{"c.yaml": "chain: [cost\n"}, `c.yaml:`},
		{"empty", map[string]string{"c.yaml": ""}, `c.yaml: empty document`},
	}
	// The whole messages are pinned by testdata/config-errors.golden.
	var all strings.Builder
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := write(t, tt.files)
			_, err := globalrouter.LoadConfig(filepath.Join(dir, "c.yaml"), builtins(t))
			if err == nil {
				t.Fatalf("LoadConfig: no error, want %q", tt.want)
			}
			got := strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), "")
			fmt.Fprintf(&all, "%s:\n  %s\n", tt.name, got)
			if !strings.Contains(got, tt.want) {
				t.Fatalf("got error %q, want one containing %q", got, tt.want)
			}
			if !errors.Is(err, policies.ErrConfig) {
				t.Errorf("error %v does not wrap policies.ErrConfig", err)
			}
		})
	}
	golden(t, "config-errors", all.String())
}

func configText(addrs map[string]string, chain string) string {
	var b strings.Builder
	b.WriteString("probe: {timeout: 10s}\nchain: " + chain + "\npools:\n")
	for _, name := range []string{"pool-a", "pool-b"} {
		if a, ok := addrs[name]; ok {
			b.WriteString("  - name: " + name + "\n    models: [" + model + "]\n    routers: {static: [\"" + a + "\"]}\n")
		}
	}
	return b.String()
}

func TestHotReload(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	both := map[string]string{"pool-a": c.a.Addr, "pool-b": c.b.Addr}
	dir := write(t, map[string]string{"pools.yaml": configText(both, "[model-match, cost]")})
	path := filepath.Join(dir, "pools.yaml")
	cfg, err := globalrouter.LoadConfig(path, builtins(t))
	if err != nil {
		t.Fatal(err)
	}
	r, reg := newRouter(t, *cfg)

	// A request in flight on pool-b across the reloads.
	c.b.Store(t, "b-0", chatTokens(t, chat(longText(100))))
	inflight, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(longText(100))...)})
	if err != nil || inflight.Primary.Pool != "pool-b" {
		t.Fatalf("Decide: %v, %+v; want pool-b", err, inflight)
	}

	// A bad file is refused; the old configuration stays.
	if err := os.WriteFile(path, []byte(configText(both, "[model-match, cost, nope]")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.ReloadFile(path); err == nil || !strings.Contains(err.Error(), `unknown policy "nope"`) {
		t.Fatalf("ReloadFile of a bad file: got %v, want the unknown policy", err)
	}
	if got := len(r.Config().Pools); got != 2 {
		t.Errorf("after a refused reload: %d pools, want the old 2", got)
	}
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Explain: true})
	if err != nil {
		t.Fatalf("Decide after a refused reload: %v", err)
	}
	if len(otherPools(d)) != 1 {
		t.Errorf("after a refused reload: %d fallbacks in the other pool, want 1 (both pools)", len(otherPools(d)))
	}
	free(t, d)

	// A good file with pool-a alone takes effect.
	if err := os.WriteFile(path, []byte(configText(map[string]string{"pool-a": c.a.Addr}, "[model-match, kv-overlap]")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.ReloadFile(path); err != nil {
		t.Fatalf("ReloadFile: %v", err)
	}
	for range 3 {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(longText(100))...)})
		if err != nil {
			t.Fatalf("Decide after reload: %v", err)
		}
		if d.Primary.Pool != "pool-a" || len(otherPools(d)) != 0 {
			t.Errorf("after reload: primary %s, fallbacks %+v; want pool-a alone", d.Primary.Pool, d.Fallbacks)
		}
		free(t, d)
	}
	// The request placed before the reload is still tracked, and frees.
	if err := c.b.WaitActive(ctx, 1); err != nil { // its commit is pipelined
		t.Error(err)
	}
	if n := c.b.ActiveRequests(); n != 1 {
		t.Errorf("pool-b has %d active requests after the reload, want 1 (in flight)", n)
	}
	free(t, inflight)
	if n := c.b.ActiveRequests(); n != 0 {
		t.Errorf("pool-b has %d active requests after Free, want 0", n)
	}
	if got := testutil.ToFloat64(mustCounter(t, reg, "kvgate_globalrouter_config_reloads_total", "refused")); got != 1 {
		t.Errorf("refused reloads = %v, want 1", got)
	}

	// WatchFile notices changes and refuses bad ones.
	results := watchFile(t, ctx, r, path, 4)
	replace(t, path, "pools: [\n")
	select {
	case err := <-results:
		if err == nil {
			t.Fatal("WatchFile accepted a broken file")
		}
	case <-ctx.Done():
		t.Fatal("WatchFile did not notice the change")
	}
	replace(t, path, configText(both, "[model-match, cost]"))
	select {
	case err := <-results:
		if err != nil {
			t.Fatalf("WatchFile refused a good file: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("WatchFile did not notice the change")
	}
	if got := len(r.Config().Pools); got != 2 {
		t.Errorf("after WatchFile's reload: %d pools, want 2", got)
	}
}

func TestBadTokenizerRefusesReload(t *testing.T) {
	c := newCluster(t)
	// Without the shared tokenizer: the configured one must load.
	r, err := globalrouter.New(c.cfg, globalrouter.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	bad := c.cfg
	bad.Models = []globalrouter.ModelConfig{{Name: model, Tokenizer: globalrouterTokenizer("huggingface", "/nonexistent")}}
	if err := r.Reload(bad); err == nil {
		t.Fatal("Reload with a tokenizer that cannot load: no error")
	}
	if len(r.Config().Models) != 0 {
		t.Error("the refused configuration replaced the current one")
	}
}

func TestNilRegistryMeansBuiltins(t *testing.T) {
	if _, err := globalrouter.LoadConfig("../examples/pools.yaml", nil); err != nil {
		t.Fatalf("LoadConfig with a nil registry: %v", err)
	}
}

// replace writes path atomically (a rename), as config management tools do,
// so the watcher never reads a half-written file.
func replace(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
