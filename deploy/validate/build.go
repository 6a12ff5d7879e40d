package validate

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Object is one manifest object after kustomize: its overlay, kind and
// name for messages, and its content as JSON-like data.
type Object struct {
	Overlay string
	Obj     map[string]any
}

// GVK returns the object's group/version/kind.
func (o Object) GVK() schema.GroupVersionKind {
	return schema.FromAPIVersionAndKind(str(o.Obj, "apiVersion"), str(o.Obj, "kind"))
}

// Kind, Name and Namespace read the object's identity.
func (o Object) Kind() string      { return str(o.Obj, "kind") }
func (o Object) Name() string      { return str(o.Obj, "metadata", "name") }
func (o Object) Namespace() string { return str(o.Obj, "metadata", "namespace") }

// String names the object in messages: overlay, kind, namespace/name.
func (o Object) String() string {
	return fmt.Sprintf("%s: %s %s/%s", o.Overlay, o.Kind(), o.Namespace(), o.Name())
}

// Build runs kustomize (the krusty library, as `kubectl kustomize` does) on
// dir and returns its objects, labelled with name.
func Build(dir, name string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []Object
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		out = append(out, Object{Overlay: name, Obj: m})
	}
	return out, nil
}

// coreScheme holds the built-in kinds the manifests use; anything else must
// have a CRD.
var coreScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// clusterScopedCore are the built-in kinds without a namespace.
var clusterScopedCore = map[string]bool{"Namespace": true}

var strictDecoder = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, coreScheme, coreScheme, kjson.SerializerOptions{Yaml: true, Strict: true})

// decodeCore decodes a built-in kind strictly into its k8s.io/api type:
// unknown and duplicate fields are errors, as `kubectl apply
// --validate=strict` makes them.
func decodeCore(o Object) (runtime.Object, error) {
	data, err := yaml.Marshal(o.Obj)
	if err != nil {
		return nil, err
	}
	obj, _, err := strictDecoder.Decode(data, nil, nil)
	return obj, err
}

// Schema validates each object on its own: core kinds strictly decoded,
// custom resources against their CRD. Every error names the object.
func (s Schemas) Schema(ctx context.Context, objs []Object) []error {
	var errs []error
	for _, o := range objs {
		gvk := o.GVK()
		if coreScheme.Recognizes(gvk) {
			if _, err := decodeCore(o); err != nil {
				errs = append(errs, fmt.Errorf("%s: strict decode: %w", o, err))
			}
			if ns := o.Namespace(); clusterScopedCore[o.Kind()] != (ns == "") {
				errs = append(errs, fmt.Errorf("%s: namespace %q on a kind whose scope is the other", o, ns))
			}
			continue
		}
		c := s[gvk]
		if c == nil {
			errs = append(errs, fmt.Errorf("%s: no schema for %s (not a core kind, no pinned CRD in %s: `KVGATE_CRD_REFRESH=1 go test -run TestCRDCache` caches the CRDs of the kinds the manifests use)", o, gvk, CRDCache))
			continue
		}
		if c.namespaced != (o.Namespace() != "") {
			errs = append(errs, fmt.Errorf("%s: namespaced=%v in %s, but metadata.namespace is %q", o, c.namespaced, c.source, o.Namespace()))
		}
		for _, e := range c.validateCustom(ctx, o.Obj) {
			errs = append(errs, fmt.Errorf("%s: %s: %v", o, c.source, e))
		}
	}
	return errs
}

// str reads a string at path in m ("" when absent).
func str(m any, path ...string) string {
	v, _ := get(m, path...).(string)
	return v
}

func get(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

func list(m any, path ...string) []any {
	l, _ := get(m, path...).([]any)
	return l
}

func obj(m any, path ...string) map[string]any {
	o, _ := get(m, path...).(map[string]any)
	return o
}
