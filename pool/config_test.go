package pool_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

func decode(t *testing.T, dir, text string) ([]pool.Config, error) {
	t.Helper()
	file := filepath.Join(dir, "pools.yaml")
	doc, err := config.ParseFile(file, []byte(text))
	if err != nil {
		return nil, err
	}
	return pool.DecodeConfigs(file, doc.Content[0])
}

func TestDecodeConfigs(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("cost:\n  scale: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("cost:\n  scale: 2\n sclae: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := decode(t, dir, `
- name: pool-a
  models: [m]
  routers: {static: ["127.0.0.1:1"]}
  policy_file: a.yaml
- name: pool-b
  role: decode
  models: [m, n]
  block_size: 64
  weight: 2
  routers: {etcd: true}
  policy:
    failover: {tier: 1}
`)
	if err != nil {
		t.Fatalf("DecodeConfigs: %v", err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d pools, want 2", len(got))
	}
	a, b := got[0], got[1]
	if a.Role != policies.RoleAggregated || a.BlockSize != 16 || a.Weight != 1 {
		t.Errorf("pool-a defaults: role %q block size %d weight %v, want aggregated 16 1", a.Role, a.BlockSize, a.Weight)
	}
	if sec := a.Policy["cost"]; sec.File != filepath.Join(dir, "a.yaml") {
		t.Errorf("pool-a cost section from %q, want a.yaml", sec.File)
	}
	if b.Role != policies.RoleDecode || b.BlockSize != 64 || !b.Routers.Etcd || b.Weight != 2 {
		t.Errorf("pool-b = %+v", b)
	}
	if diff := cmp.Diff([]string{"m", "n"}, b.Models); diff != "" {
		t.Errorf("models (-want +got):\n%s", diff)
	}

	errs := []struct {
		name, text, want string
	}{
		{"unknown field", "- name: a\n  models: [m]\n  blok_size: 3\n", `pools.yaml:3:3: pools[0]: unknown field "blok_size"`},
		{"unknown routers field", "- name: a\n  models: [m]\n  routers: {statc: [x]}\n", `pools.yaml:3:13: pools[0].routers: unknown field "statc"`},
		{"bad role", "- name: a\n  role: both\n  models: [m]\n  routers: {etcd: true}\n", `pools.yaml:2:3: pool "a": role: "both"`},
		{"no models", "- name: a\n  routers: {etcd: true}\n", `pools.yaml:1:3: pool "a": models: at least one model`},
		{"no routers", "- name: a\n  models: [m]\n", `pool "a": routers: set static addresses or etcd`},
		{"both routers", "- name: a\n  models: [m]\n  routers: {etcd: true, static: [\"h:1\"]}\n", `static and etcd are exclusive`},
		{"bad address", "- name: a\n  models: [m]\n  routers: {static: [nope]}\n", `static address "nope"`},
		{"bad block size", "- name: a\n  models: [m]\n  block_size: -16\n  routers: {etcd: true}\n", `pools.yaml:3:3: pool "a": block_size: got -16`},
		{"type error", "- name: a\n  models: [m]\n  block_size: big\n  routers: {etcd: true}\n", `pools.yaml:3: pools[0]: cannot unmarshal`},
		{"duplicate", "- {name: a, models: [m], routers: {etcd: true}}\n- {name: a, models: [m], routers: {etcd: true}}\n", `pool "a" defined twice`},
		{"bad name", "- {name: a/b, models: [m], routers: {etcd: true}}\n", `must not contain`},
		{"policy section not a map", "- {name: a, models: [m], routers: {etcd: true}, policy: [x]}\n", `pools.yaml:1:57: policy: pool policy section must be a mapping`},
		{"policy file syntax", "- {name: a, models: [m], routers: {etcd: true}, policy_file: bad.yaml}\n", `bad.yaml:2: did not find expected key`},
		{"policy file missing", "- {name: a, models: [m], routers: {etcd: true}, policy_file: none.yaml}\n", `none.yaml`},
		{"not a list", "name: a\n", `pools: must be a list`},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decode(t, dir, tt.text)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestNew(t *testing.T) {
	c := pool.NewConfig("pool-a", 0, []string{"m"}, "127.0.0.1:7101")
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if c.BlockSize != pool.DefaultBlockSize || c.Role != policies.RoleAggregated {
		t.Errorf("New defaults: %+v", c)
	}
	c.Models = nil
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `<go>: pool "pool-a": models`) {
		t.Errorf("Validate without models: got %v", err)
	}
}
