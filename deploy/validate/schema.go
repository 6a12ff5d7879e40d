// Package validate checks kvgate's Kubernetes manifests (deploy/) the way an
// API server would, offline: every overlay is built with the kustomize
// library; core kinds are decoded strictly into k8s.io/api types (an
// unknown field is an error); every custom resource is validated against
// its project's CRD at a pinned version (copied into testdata/crds from
// the project's Go module: CRDCache), with k8s.io/apiextensions-apiserver's
// own code — structural schema,
// unknown-field pruning (reported as an error), defaulting, OpenAPI schema
// validation, list-type rules and CEL rules. Checks across objects (Check)
// then catch what no schema can: references that do not resolve, selectors
// that match no pod, probes on undeclared ports, missing TLS on a gRPC hop,
// and so on.
//
// It is its own Go module so that kvgate's main module never depends on
// Kubernetes. `make test` runs its tests (mk/deploy.mk).
//
// Files: build.go (Build: an overlay through kustomize, core kinds decoded
// strictly), schema.go (the CRD sources, validating custom resources),
// crdcache.go (the pinned CRDs kept in testdata/crds: LoadCachedSchemas,
// their verification and refresh), kvgate.go (the Dockerfile's build line, the static binary,
// ReadFlags), check.go (Check, the index of objects, shared helpers),
// check_workloads.go (replicas, resources, probes, selectors),
// check_refs.go (references between objects), check_gateway.go (routes,
// backends, Envoy's circuit breaker and ext_proc), check_tls.go (TLS on
// every gRPC hop), check_kvgate.go (kvgate's own settings: patches, block
// sizes, engines, flags, listen addresses beyond loopback), check_pd.go
// (llm-d's routing sidecar: its flags against its source, its ports;
// vLLM's KV transfer; readiness probes), check_identity.go (tenants from
// Envoy, tenancy.identity xfcc and jwt-claim: the clients' mutual TLS and
// XFCC mode, the JWT provider and forwarded metadata, Envoy's client
// certificate towards a kvgate that requires one). Tests beside them.
//
// Envoy Gateway's own translator (gatewayapi → xDS) is not run: it is an
// internal package of github.com/envoyproxy/gateway, and its command
// (egctl x translate) needs that module's whole dependency tree, which
// the offline build does not hold. What it would add, and these checks
// cannot see, is the xDS it generates (listeners, clusters, filter order).
package validate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// CRDSource is one project's CRDs: a Go module at a pinned version and the
// CRD files inside its module zip (globs relative to the module root).
type CRDSource struct {
	Module, Version string
	Globs           []string
}

// Sources are the CRDs the manifests are validated against. Gateway API is
// the version Envoy Gateway v1.9.1 requires and bundles (v1.6.1), standard
// channel.
var Sources = []CRDSource{
	{Module: "sigs.k8s.io/gateway-api", Version: "v1.6.1", Globs: []string{"config/crd/standard/gateway.networking.k8s.io_*.yaml"}},
	{Module: "github.com/envoyproxy/gateway", Version: "v1.9.1", Globs: []string{"charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_*.yaml"}},
	{Module: "sigs.k8s.io/gateway-api-inference-extension", Version: "v1.0.0", Globs: []string{"config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"}},
	{Module: "github.com/cert-manager/cert-manager", Version: "v1.21.2", Globs: []string{"deploy/crds/cert-manager.io_*.yaml"}},
}

// crdVersion is one served version of one CRD, ready to validate objects.
type crdVersion struct {
	source     string // module@version and file, for messages
	namespaced bool
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaCreateValidator
	cel        *cel.Validator
}

// Schemas maps a group/version/kind to its CRD version.
type Schemas map[schema.GroupVersionKind]*crdVersion

// ModuleDir returns the folder of module@version in the Go module cache,
// downloading it through the Go module proxy if needed (RefreshCRDCache). The command runs
// outside any module, so no go.mod or go.sum is touched.
func ModuleDir(ctx context.Context, module, version string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=on")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	_ = json.Unmarshal(out, &info)
	if err != nil || info.Dir == "" {
		var ee *exec.ExitError
		msg := info.Error
		if errors.As(err, &ee) && msg == "" {
			msg = strings.TrimSpace(string(ee.Stderr))
		}
		return "", fmt.Errorf("go mod download %s@%s: %v %s", module, version, err, msg)
	}
	return info.Dir, nil
}

func (s Schemas) addFile(path, name string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for i, doc := range splitYAML(data) {
		var tm struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return fmt.Errorf("%s document %d: %w", name, i+1, err)
		}
		if tm.Kind != "CustomResourceDefinition" {
			continue // e.g. a ValidatingAdmissionPolicy shipped beside the CRDs
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(doc, &crd); err != nil {
			return fmt.Errorf("%s document %d: %w", name, i+1, err)
		}
		apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&crd)
		var internal apiextensionsinternal.CustomResourceDefinition
		if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&crd, &internal, nil); err != nil {
			return fmt.Errorf("%s: %s: %w", name, crd.Name, err)
		}
		for _, v := range internal.Spec.Versions {
			if !v.Served {
				continue
			}
			props := internal.Spec.Validation
			if v.Schema != nil {
				props = v.Schema
			}
			if props == nil || props.OpenAPIV3Schema == nil {
				return fmt.Errorf("%s: %s %s: no schema", name, crd.Name, v.Name)
			}
			st, err := structuralschema.NewStructural(props.OpenAPIV3Schema)
			if err != nil {
				return fmt.Errorf("%s: %s %s: not a structural schema: %w", name, crd.Name, v.Name, err)
			}
			if errs := structuralschema.ValidateStructural(nil, st); len(errs) > 0 {
				return fmt.Errorf("%s: %s %s: not a structural schema: %v", name, crd.Name, v.Name, errs.ToAggregate())
			}
			sv, _, err := apiservervalidation.NewSchemaValidator(props.OpenAPIV3Schema)
			if err != nil {
				return fmt.Errorf("%s: %s %s: %w", name, crd.Name, v.Name, err)
			}
			gvk := schema.GroupVersionKind{Group: internal.Spec.Group, Version: v.Name, Kind: internal.Spec.Names.Kind}
			s[gvk] = &crdVersion{
				source:     name,
				namespaced: internal.Spec.Scope == apiextensionsinternal.NamespaceScoped,
				structural: st,
				schema:     sv,
				cel:        cel.NewValidator(st, true, celconfig.PerCallLimit),
			}
		}
	}
	return nil
}

// validateCustom runs, on a copy of obj, what the API server runs on a
// custom resource at create: pruning (any pruned field is reported),
// defaulting, OpenAPI schema validation, list-type rules and CEL rules.
func (c *crdVersion) validateCustom(ctx context.Context, obj map[string]any) field.ErrorList {
	u := deepCopy(obj)
	var errs field.ErrorList
	opts := structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}
	for _, p := range pruning.PruneWithOptions(u, c.structural, true, opts) {
		errs = append(errs, field.Forbidden(field.NewPath(p), "unknown field (the API server would prune it)"))
	}
	defaulting.Default(u, c.structural)
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, u, c.schema)...)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, c.structural, u)...)
	celErrs, _ := c.cel.Validate(ctx, nil, c.structural, u, nil, celconfig.RuntimeCELCostBudget)
	errs = append(errs, celErrs...)
	return errs
}

// deepCopy copies m as the API server holds a decoded object: numbers are
// int64 when integral, float64 otherwise (CEL tells int from double).
func deepCopy(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out any
	_ = d.Decode(&out)
	o, _ := numbers(out).(map[string]any)
	return o
}

func numbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	}
	return v
}

func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), data...), []byte("\n---")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}
