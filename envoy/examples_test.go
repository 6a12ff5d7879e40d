package envoy

// Structural validation of the Envoy Gateway manifests in
// examples/gateway. The Envoy Gateway Go module is not available here, so
// the kinds kvgate relies on are mirrored below from Envoy Gateway's
// api/v1alpha1 (EnvoyExtensionPolicy, EnvoyPatchPolicy) and Gateway API v1
// (the fields used), and decoded strictly: an unknown or misspelt field is
// an error. Envoy resources inside an EnvoyPatchPolicy are decoded into
// Envoy's own protos and validated like the bootstrap.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

const examplesDir = "../examples/gateway"

type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type typeMeta struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
}

type targetRef struct {
	Group       string `json:"group"`
	Kind        string `json:"kind"`
	Name        string `json:"name"`
	SectionName string `json:"sectionName,omitempty"`
}

type backendRef struct {
	Group     *string `json:"group,omitempty"`
	Kind      string  `json:"kind,omitempty"`
	Name      string  `json:"name"`
	Namespace string  `json:"namespace,omitempty"`
	Port      int     `json:"port"`
}

type extProcMode struct {
	Body       string   `json:"body,omitempty"`
	Attributes []string `json:"attributes,omitempty"`
}

// envoyExtensionPolicy mirrors gateway.envoyproxy.io/v1alpha1
// EnvoyExtensionPolicy (extProc only).
type envoyExtensionPolicy struct {
	typeMeta `json:",inline"`
	Spec     struct {
		TargetRefs []targetRef `json:"targetRefs"`
		ExtProc    []struct {
			BackendRefs    []backendRef `json:"backendRefs"`
			MessageTimeout string       `json:"messageTimeout,omitempty"`
			FailOpen       *bool        `json:"failOpen,omitempty"`
			ProcessingMode *struct {
				Request           *extProcMode `json:"request,omitempty"`
				Response          *extProcMode `json:"response,omitempty"`
				AllowModeOverride bool         `json:"allowModeOverride,omitempty"`
			} `json:"processingMode,omitempty"`
			Metadata *struct {
				AccessibleNamespaces []string `json:"accessibleNamespaces,omitempty"`
				WritableNamespaces   []string `json:"writableNamespaces,omitempty"`
			} `json:"metadata,omitempty"`
		} `json:"extProc"`
	} `json:"spec"`
}

// envoyPatchPolicy mirrors gateway.envoyproxy.io/v1alpha1 EnvoyPatchPolicy.
type envoyPatchPolicy struct {
	typeMeta `json:",inline"`
	Spec     struct {
		TargetRef   targetRef `json:"targetRef"`
		Type        string    `json:"type"`
		Priority    int       `json:"priority,omitempty"`
		JSONPatches []struct {
			Type      string `json:"type"`
			Name      string `json:"name"`
			Operation struct {
				Op    string          `json:"op"`
				Path  *string         `json:"path,omitempty"`
				From  string          `json:"from,omitempty"`
				Value json.RawMessage `json:"value,omitempty"`
			} `json:"operation"`
		} `json:"jsonPatches"`
	} `json:"spec"`
}

type gatewayClass struct {
	typeMeta `json:",inline"`
	Spec     struct {
		ControllerName string `json:"controllerName"`
	} `json:"spec"`
}

type gateway struct {
	typeMeta `json:",inline"`
	Spec     struct {
		GatewayClassName string `json:"gatewayClassName"`
		Listeners        []struct {
			Name     string `json:"name"`
			Protocol string `json:"protocol"`
			Port     int    `json:"port"`
		} `json:"listeners"`
	} `json:"spec"`
}

type httpRoute struct {
	typeMeta `json:",inline"`
	Spec     struct {
		ParentRefs []targetRef `json:"parentRefs"`
		Rules      []struct {
			Matches []struct {
				Path struct {
					Type  string `json:"type"`
					Value string `json:"value"`
				} `json:"path"`
			} `json:"matches"`
			BackendRefs []backendRef `json:"backendRefs"`
		} `json:"rules"`
	} `json:"spec"`
}

type service struct {
	typeMeta `json:",inline"`
	Spec     struct {
		ClusterIP string            `json:"clusterIP,omitempty"`
		Selector  map[string]string `json:"selector"`
		Ports     []servicePort     `json:"ports"`
	} `json:"spec"`
}

type servicePort struct {
	Name        string `json:"name"`
	Port        int    `json:"port"`
	TargetPort  int    `json:"targetPort"`
	AppProtocol string `json:"appProtocol,omitempty"`
}

// manifests holds every object of examples/gateway by kind.
type manifests struct {
	classes  []gatewayClass
	gateways []gateway
	routes   []httpRoute
	services []service
	eeps     []envoyExtensionPolicy
	patches  []envoyPatchPolicy
	others   []typeMeta
}

func decodeManifests(files map[string][]byte) (*manifests, error) {
	m := &manifests{}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	}) {
		for i, doc := range bytes.Split(files[name], []byte("\n---\n")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			where := fmt.Sprintf("%s document %d", name, i+1)
			var tm struct {
				typeMeta `json:",inline"`
			}
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			var err error
			switch tm.APIVersion + " " + tm.Kind {
			case "gateway.networking.k8s.io/v1 GatewayClass":
				m.classes, err = appendStrict(m.classes, doc)
			case "gateway.networking.k8s.io/v1 Gateway":
				m.gateways, err = appendStrict(m.gateways, doc)
			case "gateway.networking.k8s.io/v1 HTTPRoute":
				m.routes, err = appendStrict(m.routes, doc)
			case "v1 Service":
				m.services, err = appendStrict(m.services, doc)
			case "gateway.envoyproxy.io/v1alpha1 EnvoyExtensionPolicy":
				m.eeps, err = appendStrict(m.eeps, doc)
			case "gateway.envoyproxy.io/v1alpha1 EnvoyPatchPolicy":
				m.patches, err = appendStrict(m.patches, doc)
			case "apps/v1 Deployment":
				m.others = append(m.others, tm.typeMeta)
			default:
				err = fmt.Errorf("unexpected kind %q %q", tm.APIVersion, tm.Kind)
			}
			if err != nil {
				return nil, fmt.Errorf("%s (%s %s): %w", where, tm.Kind, tm.Metadata.Name, err)
			}
		}
	}
	return m, nil
}

func appendStrict[T any](s []T, doc []byte) ([]T, error) {
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		return s, err
	}
	return append(s, v), nil
}

// gatewayDuration is Gateway API's Duration format, which
// EnvoyExtensionPolicy.messageTimeout uses.
var gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

var extProcBodyModes = []string{"Streamed", "Buffered", "BufferedPartial", "FullDuplexStreamed"}

// check validates the rules Envoy Gateway's CRDs and CEL enforce for the
// fields kvgate uses, and the references between the objects.
func (m *manifests) check() []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	has := func(kind, ns, name string) bool {
		switch kind {
		case "HTTPRoute":
			return slices.ContainsFunc(m.routes, func(r httpRoute) bool { return r.Metadata.Namespace == ns && r.Metadata.Name == name })
		case "Gateway":
			return slices.ContainsFunc(m.gateways, func(g gateway) bool { return g.Metadata.Namespace == ns && g.Metadata.Name == name })
		}
		return false
	}
	servicePort := func(ns, name string, port int) bool {
		return slices.ContainsFunc(m.services, func(s service) bool {
			return s.Metadata.Namespace == ns && s.Metadata.Name == name &&
				slices.ContainsFunc(s.Spec.Ports, func(p servicePort) bool { return p.Port == port })
		})
	}
	for _, g := range m.gateways {
		if !slices.ContainsFunc(m.classes, func(c gatewayClass) bool { return c.Metadata.Name == g.Spec.GatewayClassName }) {
			fail("Gateway %s: unknown GatewayClass %q", g.Metadata.Name, g.Spec.GatewayClassName)
		}
	}
	for _, r := range m.routes {
		for _, p := range r.Spec.ParentRefs {
			if !has(p.Kind, r.Metadata.Namespace, p.Name) {
				fail("HTTPRoute %s: parent %s %s not found", r.Metadata.Name, p.Kind, p.Name)
			}
		}
		for _, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if !servicePort(r.Metadata.Namespace, b.Name, b.Port) {
					fail("HTTPRoute %s: backend Service %s:%d not found", r.Metadata.Name, b.Name, b.Port)
				}
			}
		}
	}
	for _, p := range m.eeps {
		if len(p.Spec.TargetRefs) == 0 {
			fail("EnvoyExtensionPolicy %s: no targetRefs", p.Metadata.Name)
		}
		for _, t := range p.Spec.TargetRefs {
			if t.Group != "gateway.networking.k8s.io" || !has(t.Kind, p.Metadata.Namespace, t.Name) {
				fail("EnvoyExtensionPolicy %s: target %s/%s %s not found", p.Metadata.Name, t.Group, t.Kind, t.Name)
			}
		}
		for i, e := range p.Spec.ExtProc {
			where := fmt.Sprintf("EnvoyExtensionPolicy %s extProc[%d]", p.Metadata.Name, i)
			if len(e.BackendRefs) != 1 {
				fail("%s: %d backendRefs, want exactly 1", where, len(e.BackendRefs))
			}
			for _, b := range e.BackendRefs {
				if b.Kind != "" && b.Kind != "Service" && b.Kind != "Backend" {
					fail("%s: backendRef kind %q", where, b.Kind)
				}
				if (b.Kind == "" || b.Kind == "Service") && !servicePort(p.Metadata.Namespace, b.Name, b.Port) {
					fail("%s: Service %s:%d not found", where, b.Name, b.Port)
				}
			}
			if e.MessageTimeout != "" && !gatewayDuration.MatchString(e.MessageTimeout) {
				fail("%s: messageTimeout %q is not a Gateway API duration", where, e.MessageTimeout)
			}
			fds := false
			if pm := e.ProcessingMode; pm != nil {
				for _, d := range []*extProcMode{pm.Request, pm.Response} {
					if d != nil && d.Body != "" && !slices.Contains(extProcBodyModes, d.Body) {
						fail("%s: body mode %q not one of %v", where, d.Body, extProcBodyModes)
					}
					if d != nil && d.Body == "FullDuplexStreamed" {
						fds = true
					}
				}
			}
			if fds && e.FailOpen != nil && *e.FailOpen {
				fail("%s: failOpen cannot be true with FullDuplexStreamed", where)
			}
			if md := e.Metadata; md != nil {
				if len(md.WritableNamespaces) > 8 {
					fail("%s: more than 8 writableNamespaces", where)
				}
				for _, ns := range md.WritableNamespaces {
					if strings.HasPrefix(ns, "envoy.filters.http") {
						fail("%s: writable namespace %q not allowed", where, ns)
					}
				}
			}
		}
	}
	for _, p := range m.patches {
		where := "EnvoyPatchPolicy " + p.Metadata.Name
		if p.Spec.Type != "JSONPatch" {
			fail("%s: type %q, want JSONPatch", where, p.Spec.Type)
		}
		if p.Spec.TargetRef.Kind != "Gateway" || !has("Gateway", p.Metadata.Namespace, p.Spec.TargetRef.Name) {
			fail("%s: targetRef must be an existing Gateway", where)
		}
		for i, jp := range p.Spec.JSONPatches {
			if !slices.Contains([]string{"add", "remove", "replace", "move", "copy", "test"}, jp.Operation.Op) {
				fail("%s jsonPatches[%d]: op %q", where, i, jp.Operation.Op)
			}
			if jp.Operation.Path == nil {
				fail("%s jsonPatches[%d]: no path", where, i)
			}
		}
	}
	return errs
}

func readExamples(t *testing.T) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s (%v)", examplesDir, err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	return files
}

func TestGatewayExamples(t *testing.T) {
	m, err := decodeManifests(readExamples(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range m.check() {
		t.Error(err)
	}
	if len(m.eeps) != 1 || len(m.eeps[0].Spec.ExtProc) != 1 {
		t.Fatalf("got %d EnvoyExtensionPolicies, want one with one extProc", len(m.eeps))
	}
	e := m.eeps[0].Spec.ExtProc[0]
	if e.FailOpen == nil || *e.FailOpen {
		t.Error("failOpen must be set to false")
	}
	if d, err := time.ParseDuration(e.MessageTimeout); err != nil || d < 200*time.Millisecond {
		t.Errorf("messageTimeout %q: want at least Envoy's 200ms default", e.MessageTimeout)
	}
	pm := e.ProcessingMode
	if pm == nil || pm.Request == nil || pm.Request.Body != "FullDuplexStreamed" || pm.Response == nil || pm.Response.Body != "FullDuplexStreamed" || pm.AllowModeOverride {
		t.Errorf("processingMode: got %+v, want FullDuplexStreamed both ways, no mode override", pm)
	}
	if e.Metadata == nil || !slices.Contains(e.Metadata.WritableNamespaces, "envoy.lb") {
		t.Error("metadata.writableNamespaces must include envoy.lb")
	}

	// The patch's cluster is a valid Envoy cluster, ORIGINAL_DST on the
	// destination header, and the route is pointed at it.
	if len(m.patches) != 1 {
		t.Fatalf("got %d EnvoyPatchPolicies, want 1", len(m.patches))
	}
	var clusterName, routeTarget string
	for _, jp := range m.patches[0].Spec.JSONPatches {
		switch jp.Type {
		case "type.googleapis.com/envoy.config.cluster.v3.Cluster":
			c := &clusterv3.Cluster{}
			if err := protojson.Unmarshal(jp.Operation.Value, c); err != nil {
				t.Fatalf("patch cluster: %v", err)
			}
			if err := Validate(c); err != nil {
				t.Errorf("patch cluster: %v", err)
			}
			if c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED ||
				!c.GetOriginalDstLbConfig().GetUseHttpHeader() || c.GetOriginalDstLbConfig().GetHttpHeaderName() != "x-gateway-destination-endpoint" {
				t.Errorf("patch cluster: got %v", c)
			}
			clusterName = c.GetName()
		case "type.googleapis.com/envoy.config.route.v3.RouteConfiguration":
			g := m.gateways[0]
			if want := g.Metadata.Namespace + "/" + g.Metadata.Name + "/" + g.Spec.Listeners[0].Name; jp.Name != want {
				t.Errorf("patched route configuration %q, want %q (Envoy Gateway's naming)", jp.Name, want)
			}
			if err := json.Unmarshal(jp.Operation.Value, &routeTarget); err != nil {
				t.Fatal(err)
			}
		}
	}
	if clusterName == "" || routeTarget != clusterName {
		t.Errorf("route points at %q, patch adds cluster %q", routeTarget, clusterName)
	}
}

// The checks catch what they claim to.
func TestGatewayExamplesRefuse(t *testing.T) {
	good := readExamples(t)
	tests := []struct {
		name, file, from, to, wantErr string
	}{
		{"misspelt field", "extproc-policy.yaml", "messageTimeout:", "messageTimout:", "unknown field"},
		{"failOpen with full duplex", "extproc-policy.yaml", "failOpen: false", "failOpen: true", "failOpen"},
		{"bad body mode", "extproc-policy.yaml", "body: FullDuplexStreamed", "body: Duplex", "body mode"},
		{"bad duration", "extproc-policy.yaml", "messageTimeout: 1s", "messageTimeout: 1 second", "duration"},
		{"dangling target", "extproc-policy.yaml", "name: llm-route", "name: nope", "not found"},
		{"two backends", "extproc-policy.yaml", "    - name: kvgate-extproc\n      port: 9002\n", "    - name: kvgate-extproc\n      port: 9002\n    - name: kvgate-extproc\n      port: 9002\n", "exactly 1"},
		{"wrong backend port", "extproc-policy.yaml", "port: 9002", "port: 9003", "not found"},
		{"filter namespace", "extproc-policy.yaml", "writableNamespaces: [envoy.lb]", "writableNamespaces: [envoy.filters.http.x]", "not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{}
			for k, v := range good {
				files[k] = v
			}
			if !bytes.Contains(files[tt.file], []byte(tt.from)) {
				t.Fatalf("%s has no %q", tt.file, tt.from)
			}
			files[tt.file] = bytes.Replace(files[tt.file], []byte(tt.from), []byte(tt.to), 1)
			m, err := decodeManifests(files)
			var msgs []string
			if err != nil {
				msgs = append(msgs, err.Error())
			} else {
				for _, e := range m.check() {
					msgs = append(msgs, e.Error())
				}
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tt.wantErr) {
				t.Errorf("got %q, want an error mentioning %q", msgs, tt.wantErr)
			}
		})
	}
}
