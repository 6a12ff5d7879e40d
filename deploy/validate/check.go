package validate

import (
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Flags are the flags of each kvgate subcommand (from `kvgate <sub> -h`).
type Flags map[string]map[string]bool

// Pending are flags the manifests may use before kvgate has them; a
// missing one is reported by Check's caller as pending, not as an error.
// Empty now that the TLS, health and admin flags exist: every flag a
// manifest passes must be one kvgate defines.
var Pending = map[string]bool{}

// Thresholds the checks hold the manifests to.
const (
	// MinCircuitBreaker: Envoy's default of 1,024 caps concurrent
	// generations (each holds a worker request and an ext_proc stream).
	MinCircuitBreaker = 10000
	// MinRouteTimeout: generations stream for minutes.
	MinRouteTimeout = 10 * time.Minute
	// DestinationHeader is the endpoint-picker protocol's header.
	DestinationHeader = "x-gateway-destination-endpoint"
)

// pod is one workload's pod template, with where it came from.
type pod struct {
	owner    Object
	replicas int32
	spec     corev1.PodSpec
	labels   map[string]string
}

type index struct {
	objs     []Object
	byKind   map[string][]Object
	pods     []pod
	services map[string]*corev1.Service // namespace/name
	secrets  map[string]bool            // namespace/name of Secrets that will exist
	errs     []error
}

func (x *index) fail(o Object, check, format string, a ...any) {
	x.errs = append(x.errs, fmt.Errorf("%s: [%s] %s", o, check, fmt.Sprintf(format, a...)))
}

func (x *index) find(kind, ns, name string) (Object, bool) {
	for _, o := range x.byKind[kind] {
		if o.Namespace() == ns && o.Name() == name {
			return o, true
		}
	}
	return Object{}, false
}

// Check runs the checks across the objects of one overlay. flags may be
// nil to skip the kvgate flag check. It returns one error per finding,
// each tagged with its check's name in brackets.
func Check(objs []Object, flags Flags) []error {
	x := &index{objs: objs, byKind: map[string][]Object{}, services: map[string]*corev1.Service{}, secrets: map[string]bool{}}
	for _, o := range objs {
		x.byKind[o.Kind()] = append(x.byKind[o.Kind()], o)
	}
	x.decodeWorkloads()
	x.checkReplicas()
	x.checkResources()
	x.checkProbes()
	x.checkSelectors()
	x.checkReferences()
	x.checkRoutes()
	x.checkExtProc()
	x.checkIdentity()
	x.checkPatches()
	x.checkTLS()
	x.checkBlockSizes()
	x.checkEngines()
	x.checkPD()
	x.checkReadiness()
	x.checkListen()
	if flags != nil {
		x.checkFlags(flags)
	}
	return x.errs
}

func (x *index) decodeWorkloads() {
	for _, o := range x.objs {
		switch o.Kind() {
		case "Deployment", "StatefulSet", "Service", "Secret":
		default:
			if o.Kind() == "Certificate" {
				x.secrets[o.Namespace()+"/"+str(o.Obj, "spec", "secretName")] = true
			}
			continue
		}
		ro, err := decodeCore(o)
		if err != nil {
			continue // reported by Schema
		}
		switch v := ro.(type) {
		case *appsv1.Deployment:
			x.pods = append(x.pods, pod{owner: o, replicas: ptrOr(v.Spec.Replicas, 1), spec: v.Spec.Template.Spec, labels: v.Spec.Template.Labels})
			x.checkOwnSelector(o, v.Spec.Selector.MatchLabels, v.Spec.Template.Labels)
		case *appsv1.StatefulSet:
			x.pods = append(x.pods, pod{owner: o, replicas: ptrOr(v.Spec.Replicas, 1), spec: v.Spec.Template.Spec, labels: v.Spec.Template.Labels})
			x.checkOwnSelector(o, v.Spec.Selector.MatchLabels, v.Spec.Template.Labels)
			if _, ok := x.find("Service", o.Namespace(), v.Spec.ServiceName); !ok {
				x.fail(o, "references", "serviceName %q: no such Service", v.Spec.ServiceName)
			}
		case *corev1.Service:
			x.services[o.Namespace()+"/"+o.Name()] = v
		case *corev1.Secret:
			x.secrets[o.Namespace()+"/"+o.Name()] = true
		}
	}
}

func ptrOr(p *int32, d int32) int32 {
	if p == nil {
		return d
	}
	return *p
}

func declaredPort(c corev1.Container, port intstr.IntOrString) bool {
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return true
		}
	}
	return false
}

// podsOf returns the pods in ns whose labels match sel.
func (x *index) podsOf(ns string, sel map[string]string) []pod {
	var out []pod
	if len(sel) == 0 {
		return nil
	}
	for _, p := range x.pods {
		if p.owner.Namespace() == ns && labels.SelectorFromSet(sel).Matches(labels.Set(p.labels)) {
			out = append(out, p)
		}
	}
	return out
}

func toStrings(m map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

func num(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	case int:
		return int64(n)
	}
	return 0
}

// servicePort reports whether Service ns/name exists with port.
func (x *index) servicePort(ns, name string, port int64) bool {
	s := x.services[ns+"/"+name]
	return s != nil && slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return int64(p.Port) == port })
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// args parsed: -name=value or -name (bool). flagValue returns "" when absent.
func flagValue(args []string, name string) string {
	for _, a := range args {
		n, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && n == name {
			if v == "" {
				return "true"
			}
			return v
		}
	}
	return ""
}

// kvgateContainers yields every container running the kvgate image, with
// its subcommand.
func (x *index) kvgateContainers(f func(p pod, c corev1.Container, sub string)) {
	for _, p := range x.pods {
		for _, c := range p.spec.Containers {
			if isKvgateImage(c.Image) && len(c.Args) > 0 {
				f(p, c, c.Args[0])
			}
		}
	}
}

func isKvgateImage(image string) bool {
	name := image
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	name, _, _ = strings.Cut(name, ":")
	name, _, _ = strings.Cut(name, "@")
	return name == "kvgate"
}

func port(endpoint string) string {
	if i := strings.LastIndex(endpoint, ":"); i >= 0 {
		return endpoint[i+1:]
	}
	return ""
}
