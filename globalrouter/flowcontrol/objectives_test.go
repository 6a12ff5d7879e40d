package flowcontrol

import (
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/lib/config"
)

const gieDir = "testdata/gie-v1.0.0/"

// TestParseObjectivesGIEExample reads the Inference Extension's own
// example objectives (v1.0.0 config/manifests/inferenceobjective.yaml):
// kept by their pool, skipped for another, as the pool's picker does.
func TestParseObjectivesGIEExample(t *testing.T) {
	data, err := os.ReadFile(gieDir + "inferenceobjective.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pool string
		want []Objective
	}{
		{"vllm-llama3-8b-instruct", []Objective{{"food-review", 1}, {"base-model", 2}, {"base-model-cpu", 2}}},
		{"", []Objective{{"food-review", 1}, {"base-model", 2}, {"base-model-cpu", 2}}},
		{"another-pool", nil},
	} {
		got, err := ParseObjectives("inferenceobjective.yaml", data, tc.pool)
		if err != nil {
			t.Fatalf("pool %q: %v", tc.pool, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("pool %q (-want +got):\n%s", tc.pool, diff)
		}
	}
}

// TestObjectiveFieldsAreTheCRDs: the manifest the parser reads strictly
// is the CRD's (v1.0.0): its group and version, spec's fields, poolRef's
// fields and defaults, what is required.
func TestObjectiveFieldsAreTheCRDs(t *testing.T) {
	data, err := os.ReadFile(gieDir + "inference.networking.x-k8s.io_inferenceobjectives.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Group    string
			Names    struct{ Kind string }
			Versions []struct {
				Name   string
				Served bool
				Schema struct {
					OpenAPIV3Schema schema `yaml:"openAPIV3Schema"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	var served []string
	var spec schema
	for _, v := range crd.Spec.Versions {
		if v.Served {
			served = append(served, crd.Spec.Group+"/"+v.Name)
			spec = v.Schema.OpenAPIV3Schema.Properties["spec"]
		}
	}
	if diff := cmp.Diff([]string{ObjectiveAPIVersion}, served); diff != "" {
		t.Errorf("served versions (-ours +CRD's):\n%s", diff)
	}
	if crd.Spec.Names.Kind != ObjectiveKind {
		t.Errorf("kind: got %q, want %q", crd.Spec.Names.Kind, ObjectiveKind)
	}
	var m objectiveManifest
	ours := map[string][]string{
		"spec":         fieldNames(reflect.TypeOf(m.Spec)),
		"spec.poolRef": fieldNames(reflect.TypeOf(m.Spec.PoolRef).Elem()),
	}
	crdFields := map[string][]string{"spec": keys(spec.Properties), "spec.poolRef": keys(spec.Properties["poolRef"].Properties)}
	if diff := cmp.Diff(crdFields, ours); diff != "" {
		t.Errorf("fields (-CRD's +parser's):\n%s", diff)
	}
	ref := spec.Properties["poolRef"]
	if got := []any{ref.Properties["group"].Default, ref.Properties["kind"].Default}; !slices.Equal(got, []any{PoolGroup, PoolKind}) {
		t.Errorf("poolRef defaults: got %q, want %q and %q", got, PoolGroup, PoolKind)
	}
	if !slices.Equal(spec.Required, []string{"poolRef"}) || !slices.Equal(ref.Required, []string{"name"}) {
		t.Errorf("required: spec %v, poolRef %v; the parser requires spec.poolRef and its name", spec.Required, ref.Required)
	}
	if spec.Properties["priority"].Type != "integer" {
		t.Errorf("priority: type %q, the parser reads an integer", spec.Properties["priority"].Type)
	}
}

type schema struct {
	Type       string
	Default    any
	Required   []string
	Properties map[string]schema
}

func keys(m map[string]schema) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// fieldNames are the yaml names of struct type t's fields, sorted.
func fieldNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

func TestParseObjectivesList(t *testing.T) {
	const in = `apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- apiVersion: inference.networking.x-k8s.io/v1alpha2
  kind: InferenceObjective
  metadata: {name: batch, namespace: default, uid: 1, creationTimestamp: "2026-01-01T00:00:00Z"}
  spec: {poolRef: {name: p}, priority: -1}
  status: {conditions: []}
- apiVersion: inference.networking.x-k8s.io/v1alpha2
  kind: InferenceObjective
  metadata: {name: standard}
  spec: {poolRef: {name: p, group: inference.networking.k8s.io, kind: InferencePool}}
- apiVersion: inference.networking.x-k8s.io/v1alpha2
  kind: InferenceObjective
  metadata: {name: other-group}
  spec: {poolRef: {name: p, group: example.com}, priority: 9}
---
`
	got, err := ParseObjectives("list.yaml", []byte(in), "p")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Objective{{"batch", -1}, {"standard", 0}}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestParseObjectivesErrors(t *testing.T) {
	const head = "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"
	for _, tc := range []struct{ name, in, want string }{
		{"kind", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n", "f.yaml:2:7: kind: \"Service\": want InferenceObjective"},
		{"version", "apiVersion: inference.networking.x-k8s.io/v1\nkind: InferenceObjective\nmetadata: {name: a}\nspec: {poolRef: {name: p}}\n", "f.yaml:1:13: apiVersion:"},
		{"no name", head + "metadata: {}\nspec: {poolRef: {name: p}}\n", "f.yaml:3:11: metadata.name: required"},
		{"bad name", head + "metadata: {name: Food_Review}\nspec: {poolRef: {name: p}}\n", "f.yaml:3:18: metadata.name: \"Food_Review\""},
		{"no poolRef", head + "metadata: {name: a}\nspec: {priority: 1}\n", "f.yaml:4:7: spec.poolRef: required"},
		{"no pool name", head + "metadata: {name: a}\nspec: {poolRef: {group: x}}\n", "spec.poolRef.name: required"},
		{"priority string", head + "metadata: {name: a}\nspec: {poolRef: {name: p}, priority: high}\n", "f.yaml:4:"},
		{"priority float", head + "metadata: {name: a}\nspec: {poolRef: {name: p}, priority: 1.5}\n", "f.yaml:4:"},
		{"unknown spec field", head + "metadata: {name: a}\nspec: {poolRef: {name: p}, criticality: Critical}\n", "f.yaml:4:28: spec: unknown field \"criticality\""},
		{"unknown top field", head + "metadata: {name: a}\nspec: {poolRef: {name: p}}\nextra: 1\n", "unknown field \"extra\""},
		{"twice", head + "metadata: {name: a}\nspec: {poolRef: {name: p}}\n---\n" + head + "metadata: {name: a}\nspec: {poolRef: {name: p}}\n", "f.yaml:6:1: metadata.name: objective \"a\" defined twice (first at line 1)"},
		{"scalar", "hello\n", "f.yaml:1:1: want an InferenceObjective manifest"},
		{"syntax", head + "metadata: {name: a\n", "f.yaml:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseObjectives("f.yaml", []byte(tc.in), "")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if err != nil && !errors.Is(err, config.ErrInvalid) {
				t.Errorf("got %v, want a config.ErrInvalid", err)
			}
		})
	}
}

func FuzzParseObjectives(f *testing.F) {
	if data, err := os.ReadFile(gieDir + "inferenceobjective.yaml"); err == nil {
		f.Add(string(data), "vllm-llama3-8b-instruct")
	}
	f.Add("apiVersion: v1\nkind: List\nitems: [{kind: InferenceObjective}]\n", "")
	f.Add("---\n---\n", "p")
	f.Add("a: &x [*x]\n", "")
	f.Fuzz(func(t *testing.T, in, pool string) {
		got, err := ParseObjectives("f.yaml", []byte(in), pool)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Errorf("error without its file: %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, o := range got {
			if !dnsSubdomain.MatchString(o.Name) || seen[o.Name] {
				t.Errorf("objective %q: not a valid name, or twice", o.Name)
			}
			seen[o.Name] = true
		}
	})
}
