package validate

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestCRDCache: testdata/crds holds, for each pinned source, the CRDs of
// the kinds the manifests use, unchanged (SHA256SUMS), and nothing else.
// With KVGATE_CRD_REFRESH=1 it first rewrites the cache from the pinned
// modules (downloaded through the Go module proxy): run it after changing
// Sources or using a kind of a new CRD.
func TestCRDCache(t *testing.T) {
	if os.Getenv("KVGATE_CRD_REFRESH") != "" {
		kinds := map[schema.GroupKind]bool{}
		for name, dir := range overlays(t) {
			objs, err := Build(dir, name)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				kinds[o.GVK().GroupKind()] = true
			}
		}
		for _, m := range mutations() { // the planted errors' own objects
			if m.add != "" {
				var o map[string]any
				if err := json.Unmarshal([]byte(m.add), &o); err != nil {
					t.Fatal(err)
				}
				kinds[Object{Obj: o}.GVK().GroupKind()] = true
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := RefreshCRDCache(ctx, CRDCache, Sources, kinds); err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range VerifyCRDCache(CRDCache, Sources) {
		t.Error(err)
	}
}
