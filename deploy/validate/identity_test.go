package validate

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestTenancyIdentityResources: the ext_proc policy that forwards the
// jwt_authn filter's metadata to kvgate (tenancy.identity jwt-claim,
// docs/security.md) is valid against Envoy Gateway v1.9.1's CRD schema and
// CEL rules (extProc.metadata.accessibleNamespaces), and the check refuses
// what that schema refuses: the same namespace made writable (CEL: no
// envoy.filters.http namespace may be written).
func TestTenancyIdentityResources(t *testing.T) {
	schemas, err := LoadCachedSchemas(CRDCache, Sources)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("testdata/identity/tenancy-identity.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var objs []Object
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, Object{Overlay: "tenancy-identity", Obj: o})
	}
	if len(objs) != 1 {
		t.Fatalf("%d objects, want 1", len(objs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, err := range schemas.Schema(ctx, objs) {
		t.Error(err)
	}
	bad := Object{Overlay: "tenancy-identity", Obj: deepCopy(objs[0].Obj)}
	md := bad.Obj["spec"].(map[string]any)["extProc"].([]any)[0].(map[string]any)["metadata"].(map[string]any)
	md["writableNamespaces"] = []any{"envoy.filters.http.jwt_authn"}
	errs := schemas.Schema(ctx, []Object{bad})
	if len(errs) == 0 || !strings.Contains(errs[0].Error(), "writableNamespaces cannot contain well-known Envoy HTTP filter namespaces") {
		t.Errorf("jwt_authn's namespace writable: %v, want the CRD's CEL refusal", errs)
	}
}
