package envoy_test

// The Kubernetes manifests live in deploy/ and are validated there, against
// the real CRDs, by the deploy/validate module (`make test`). What this
// package checks is what needs kvgate's own code: each overlay's pools.yaml
// loads with the global router's strict loader, and examples/gateway stays
// a kustomization of deploy/ with no manifest of its own to drift.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/policies"
)

func TestDeployPoolsConfigsLoad(t *testing.T) {
	files, err := filepath.Glob("../deploy/overlays/*/pools.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no pools.yaml under deploy/overlays (%v)", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) {
			reg := policies.NewRegistry()
			if err := policies.RegisterBuiltins(reg); err != nil {
				t.Fatal(err)
			}
			cfg, err := globalrouter.LoadConfig(f, reg)
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Pools) == 0 {
				t.Errorf("%s: no pools", f)
			}
		})
	}
}

func TestGatewayExampleBuildsFromDeploy(t *testing.T) {
	entries, err := os.ReadDir("../examples/gateway")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"README.md", "kustomization.yaml"}; !slices.Equal(names, want) {
		t.Errorf("examples/gateway holds %q, want only %q (the manifests live in deploy/)", names, want)
	}
	k, err := os.ReadFile("../examples/gateway/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(k), "../../deploy/overlays/") {
		t.Errorf("examples/gateway/kustomization.yaml does not build from deploy/overlays")
	}
}
