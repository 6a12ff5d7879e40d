package validate

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
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
	x.checkPatches()
	x.checkTLS()
	x.checkBlockSizes()
	x.checkEngines()
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

func (x *index) checkOwnSelector(o Object, sel, lbl map[string]string) {
	if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(labels.Set(lbl)) {
		x.fail(o, "selectors", "selector %v does not match its own pod template labels %v", sel, lbl)
	}
}

// kvgate's stateless parts: the global router and the local routers
// (replicas share lifecycle by replica sync).
var stateless = map[string]bool{"kvgate-extproc": true, "kvgate-localrouter": true}

func (x *index) checkReplicas() {
	for _, p := range x.pods {
		name := p.labels["app.kubernetes.io/name"]
		if !stateless[name] {
			continue
		}
		if p.replicas < 2 {
			x.fail(p.owner, "replicas", "%d replicas of %s, want at least 2 (one pod lost must not stop routing)", p.replicas, name)
		}
		covered := false
		for _, o := range x.byKind["PodDisruptionBudget"] {
			ro, err := decodeCore(o)
			if err != nil {
				continue
			}
			pdb := ro.(*policyv1.PodDisruptionBudget)
			if o.Namespace() == p.owner.Namespace() && pdb.Spec.Selector != nil && labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(labels.Set(p.labels)) {
				covered = true
			}
		}
		if !covered {
			x.fail(p.owner, "replicas", "no PodDisruptionBudget covers its pods")
		}
	}
}

func (x *index) checkResources() {
	for _, p := range x.pods {
		for _, c := range append(slices.Clone(p.spec.InitContainers), p.spec.Containers...) {
			r := c.Resources
			if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
				x.fail(p.owner, "resources", "container %s: want requests.cpu, requests.memory and limits.memory set", c.Name)
			}
		}
	}
}

func declaredPort(c corev1.Container, port intstr.IntOrString) bool {
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return true
		}
	}
	return false
}

func (x *index) checkProbes() {
	for _, p := range x.pods {
		for _, c := range p.spec.Containers {
			for what, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
				if pr == nil {
					continue
				}
				var port intstr.IntOrString
				switch {
				case pr.HTTPGet != nil:
					port = pr.HTTPGet.Port
				case pr.TCPSocket != nil:
					port = pr.TCPSocket.Port
				case pr.GRPC != nil:
					port = intstr.FromInt32(pr.GRPC.Port)
				default:
					continue
				}
				if !declaredPort(c, port) {
					x.fail(p.owner, "probes", "container %s: %s probe on port %s, which the container does not declare", c.Name, what, port.String())
				}
			}
			if strings.HasPrefix(c.Image, "kvgate") && len(c.Args) > 0 && (c.Args[0] == "extproc" || c.Args[0] == "localrouter") {
				if c.ReadinessProbe == nil || c.ReadinessProbe.GRPC == nil || c.LivenessProbe == nil || c.LivenessProbe.GRPC == nil {
					x.fail(p.owner, "probes", "container %s: kvgate %s wants gRPC readiness and liveness probes", c.Name, c.Args[0])
				} else if hp := flagValue(c.Args, "health-addr"); !strings.HasSuffix(hp, ":"+strconv.Itoa(int(c.ReadinessProbe.GRPC.Port))) {
					x.fail(p.owner, "probes", "container %s: gRPC probe on %d, but -health-addr is %q (the kubelet's gRPC probe has no TLS: probe the plaintext health port)", c.Name, c.ReadinessProbe.GRPC.Port, hp)
				}
			}
		}
	}
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

func (x *index) checkSelectors() {
	for _, o := range x.byKind["Service"] {
		s := x.services[o.Namespace()+"/"+o.Name()]
		if s == nil || len(s.Spec.Selector) == 0 {
			continue
		}
		pods := x.podsOf(o.Namespace(), s.Spec.Selector)
		if len(pods) == 0 {
			x.fail(o, "selectors", "selector %v matches no pod", s.Spec.Selector)
			continue
		}
		for _, sp := range s.Spec.Ports {
			tp := sp.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(sp.Port)
			}
			for _, p := range pods {
				if !slices.ContainsFunc(p.spec.Containers, func(c corev1.Container) bool { return declaredPort(c, tp) }) {
					x.fail(o, "selectors", "port %s: targetPort %s not declared by %s", sp.Name, tp.String(), p.owner)
				}
			}
		}
	}
	for _, o := range x.byKind["PodDisruptionBudget"] {
		sel, _ := get(o.Obj, "spec", "selector", "matchLabels").(map[string]any)
		if len(x.podsOf(o.Namespace(), toStrings(sel))) == 0 {
			x.fail(o, "selectors", "selector %v matches no pod", sel)
		}
	}
	for _, o := range x.byKind["InferencePool"] {
		sel, _ := get(o.Obj, "spec", "selector", "matchLabels").(map[string]any)
		pods := x.podsOf(o.Namespace(), toStrings(sel))
		if len(pods) == 0 {
			x.fail(o, "selectors", "selector %v matches no pod", sel)
		}
		for _, tp := range list(o.Obj, "spec", "targetPorts") {
			n := num(get(tp, "number"))
			for _, p := range pods {
				if !slices.ContainsFunc(p.spec.Containers, func(c corev1.Container) bool { return declaredPort(c, intstr.FromInt32(int32(n))) }) {
					x.fail(o, "selectors", "targetPort %d not declared by %s", n, p.owner)
				}
			}
		}
	}
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

func (x *index) checkReferences() {
	for _, p := range x.pods {
		for _, v := range p.spec.Volumes {
			switch {
			case v.ConfigMap != nil:
				if _, ok := x.find("ConfigMap", p.owner.Namespace(), v.ConfigMap.Name); !ok {
					x.fail(p.owner, "references", "volume %s: no ConfigMap %q", v.Name, v.ConfigMap.Name)
				}
			case v.Secret != nil:
				if !x.secrets[p.owner.Namespace()+"/"+v.Secret.SecretName] {
					x.fail(p.owner, "references", "volume %s: no Secret %q (nor a Certificate that makes it)", v.Name, v.Secret.SecretName)
				}
			}
		}
		for _, c := range p.spec.Containers {
			for _, m := range c.VolumeMounts {
				if !slices.ContainsFunc(p.spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) &&
					!isClaimTemplate(p.owner, m.Name) {
					x.fail(p.owner, "references", "container %s mounts %q, which is no volume", c.Name, m.Name)
				}
			}
		}
	}
	for _, o := range x.byKind["Gateway"] {
		if _, ok := x.find("GatewayClass", "", str(o.Obj, "spec", "gatewayClassName")); !ok {
			x.fail(o, "references", "no GatewayClass %q", str(o.Obj, "spec", "gatewayClassName"))
		}
	}
	for _, o := range x.byKind["HTTPRoute"] {
		for _, pr := range list(o.Obj, "spec", "parentRefs") {
			if _, ok := x.find(orDefault(str(pr, "kind"), "Gateway"), orDefault(str(pr, "namespace"), o.Namespace()), str(pr, "name")); !ok {
				x.fail(o, "references", "parentRef %s %q not found", str(pr, "kind"), str(pr, "name"))
			}
		}
		for _, r := range list(o.Obj, "spec", "rules") {
			for _, b := range list(r, "backendRefs") {
				x.backendRef(o, b)
			}
		}
	}
	for _, kind := range []string{"EnvoyExtensionPolicy", "BackendTrafficPolicy", "BackendTLSPolicy"} {
		for _, o := range x.byKind[kind] {
			for _, t := range list(o.Obj, "spec", "targetRefs") {
				if _, ok := x.find(str(t, "kind"), o.Namespace(), str(t, "name")); !ok {
					x.fail(o, "references", "targetRef %s %q not found", str(t, "kind"), str(t, "name"))
				}
			}
		}
	}
	for _, o := range x.byKind["EnvoyExtensionPolicy"] {
		for _, e := range list(o.Obj, "spec", "extProc") {
			for _, b := range list(e, "backendRefs") {
				x.backendRef(o, b)
			}
		}
	}
	for _, o := range x.byKind["BackendTLSPolicy"] {
		for _, c := range list(o.Obj, "spec", "validation", "caCertificateRefs") {
			if str(c, "kind") == "Secret" && !x.secrets[o.Namespace()+"/"+str(c, "name")] {
				x.fail(o, "references", "caCertificateRef Secret %q not found", str(c, "name"))
			}
			if str(c, "kind") == "ConfigMap" {
				if _, ok := x.find("ConfigMap", o.Namespace(), str(c, "name")); !ok {
					x.fail(o, "references", "caCertificateRef ConfigMap %q not found", str(c, "name"))
				}
			}
		}
	}
	for _, o := range x.byKind["InferencePool"] {
		e := obj(o.Obj, "spec", "endpointPickerRef")
		if !x.servicePort(o.Namespace(), str(e, "name"), num(get(e, "port", "number"))) {
			x.fail(o, "references", "endpointPickerRef Service %s:%d not found", str(e, "name"), num(get(e, "port", "number")))
		}
	}
	for _, o := range x.byKind["Certificate"] {
		ir := obj(o.Obj, "spec", "issuerRef")
		if _, ok := x.find(orDefault(str(ir, "kind"), "Issuer"), o.Namespace(), str(ir, "name")); !ok {
			x.fail(o, "references", "issuerRef %s %q not found", str(ir, "kind"), str(ir, "name"))
		}
	}
	for _, o := range x.byKind["Issuer"] {
		if s := str(o.Obj, "spec", "ca", "secretName"); s != "" && !x.secrets[o.Namespace()+"/"+s] {
			x.fail(o, "references", "ca.secretName %q: no Certificate makes it", s)
		}
	}
}

func isClaimTemplate(o Object, name string) bool {
	for _, t := range list(o.Obj, "spec", "volumeClaimTemplates") {
		if str(t, "metadata", "name") == name {
			return true
		}
	}
	return false
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func (x *index) backendRef(o Object, b any) {
	ns := orDefault(str(b, "namespace"), o.Namespace())
	switch kind := orDefault(str(b, "kind"), "Service"); kind {
	case "Service":
		if !x.servicePort(ns, str(b, "name"), num(get(b, "port"))) {
			x.fail(o, "references", "backendRef Service %s:%d not found", str(b, "name"), num(get(b, "port")))
		}
	default:
		if _, ok := x.find(kind, ns, str(b, "name")); !ok {
			x.fail(o, "references", "backendRef %s %q not found", kind, str(b, "name"))
		}
	}
}

// checkRoutes: long generations need route timeouts; a route to workers
// behind Envoy Gateway needs the endpoint override and raised limits.
func (x *index) checkRoutes() {
	for _, o := range x.byKind["HTTPRoute"] {
		for i, r := range list(o.Obj, "spec", "rules") {
			d, err := time.ParseDuration(str(r, "timeouts", "request"))
			if err != nil || (d != 0 && d < MinRouteTimeout) {
				x.fail(o, "timeouts", "rule %d: timeouts.request %q, want 0s (none) or at least %v: Envoy's default 15s cuts long generations", i, str(r, "timeouts", "request"), MinRouteTimeout)
			}
		}
		toInferencePool := false
		for _, r := range list(o.Obj, "spec", "rules") {
			for _, b := range list(r, "backendRefs") {
				toInferencePool = toInferencePool || str(b, "kind") == "InferencePool"
			}
		}
		if toInferencePool || len(x.byKind["EnvoyExtensionPolicy"]) == 0 {
			continue // the Inference Extension gateway does the override itself
		}
		var btp Object
		found := false
		for _, p := range x.byKind["BackendTrafficPolicy"] {
			if targets(p, "HTTPRoute", o.Name()) {
				btp, found = p, true
			}
		}
		if !found {
			x.fail(o, "endpoint-override", "no BackendTrafficPolicy targets it: Envoy Gateway would balance over the workers itself, ignoring kvgate's pick")
			continue
		}
		ok := false
		for _, e := range list(btp.Obj, "spec", "loadBalancer", "endpointOverride", "extractFrom") {
			ok = ok || strings.EqualFold(str(e, "header"), DestinationHeader)
		}
		if !ok {
			x.fail(btp, "endpoint-override", "loadBalancer.endpointOverride does not read %s", DestinationHeader)
		}
		x.circuitBreaker(btp, obj(btp.Obj, "spec", "circuitBreaker"), "spec.circuitBreaker")
	}
}

func targets(o Object, kind, name string) bool {
	return slices.ContainsFunc(list(o.Obj, "spec", "targetRefs"), func(t any) bool { return str(t, "kind") == kind && str(t, "name") == name })
}

func (x *index) circuitBreaker(o Object, cb map[string]any, where string) {
	for _, k := range []string{"maxConnections", "maxPendingRequests", "maxParallelRequests"} {
		if num(cb[k]) < MinCircuitBreaker {
			x.fail(o, "circuit-breakers", "%s.%s %d, want at least %d (Envoy's default 1,024 caps concurrent generations)", where, k, num(cb[k]), MinCircuitBreaker)
		}
	}
}

func (x *index) checkExtProc() {
	for _, o := range x.byKind["EnvoyExtensionPolicy"] {
		for i, e := range list(o.Obj, "spec", "extProc") {
			where := fmt.Sprintf("extProc[%d]", i)
			req, resp := str(e, "processingMode", "request", "body"), str(e, "processingMode", "response", "body")
			if req != "FullDuplexStreamed" || resp != "FullDuplexStreamed" {
				x.fail(o, "full-duplex", "%s: body modes %q/%q, want FullDuplexStreamed both ways (kvgate reads the whole request; the response drives the lifecycle)", where, req, resp)
			}
			if _, set := obj(e)["messageTimeout"]; set && (req == "FullDuplexStreamed" || resp == "FullDuplexStreamed") {
				x.fail(o, "full-duplex", "%s: messageTimeout set, but Envoy runs no message timer under FullDuplexStreamed (headers and trailers included): it bounds nothing", where)
			}
			if fo, _ := get(e, "failOpen").(bool); fo {
				x.fail(o, "full-duplex", "%s: failOpen true", where)
			}
			x.circuitBreaker(o, obj(e, "backendSettings", "circuitBreaker"), where+".backendSettings.circuitBreaker")
			if !slices.Contains(list(e, "metadata", "writableNamespaces"), any("envoy.lb")) {
				x.fail(o, "full-duplex", "%s: metadata.writableNamespaces lacks envoy.lb: Envoy drops kvgate's pick", where)
			}
		}
	}
}

var positional = regexp.MustCompile(`/[0-9]+(/|$)`)

func (x *index) checkPatches() {
	for _, o := range x.byKind["EnvoyPatchPolicy"] {
		for i, p := range list(o.Obj, "spec", "jsonPatches") {
			for _, k := range []string{"path", "from"} {
				if v := str(p, "operation", k); positional.MatchString(v) {
					x.fail(o, "positional-patch", "jsonPatches[%d].operation.%s %q indexes a list by position: Envoy Gateway's generated order changes with any other route", i, k, v)
				}
			}
		}
	}
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

// checkTLS: every gRPC hop between pods runs TLS. kvgate servers serve
// TLS; the global router verifies local routers; every etcd and NATS
// client uses TLS with a CA; Envoy reaches the ext_proc Service through a
// BackendTLSPolicy; etcd and NATS themselves serve TLS.
func (x *index) checkTLS() {
	x.kvgateContainers(func(p pod, c corev1.Container, sub string) {
		need := func(names ...string) {
			for _, n := range names {
				if flagValue(c.Args, n) == "" {
					x.fail(p.owner, "tls", "container %s (kvgate %s): -%s not set", c.Name, sub, n)
				}
			}
		}
		switch sub {
		case "extproc":
			if flagValue(c.Args, "secure-serving") == "" {
				need("tls-cert-file", "tls-key-file")
			}
			need("router-tls-ca-file", "router-tls-server-name")
		case "localrouter":
			need("tls-cert-file", "tls-key-file", "tls-client-ca-file")
		}
		if e := flagValue(c.Args, "etcd"); e != "" {
			for _, ep := range strings.Split(e, ",") {
				if !strings.HasPrefix(ep, "https://") {
					x.fail(p.owner, "tls", "container %s: -etcd endpoint %q is not https://", c.Name, ep)
				}
			}
			need("etcd-ca-file")
		}
		for _, n := range []string{"nats", "nats-url"} {
			if u := flagValue(c.Args, n); u != "" {
				if pu, err := url.Parse(u); err != nil || pu.Scheme != "tls" {
					x.fail(p.owner, "tls", "container %s: -%s %q is not tls://", c.Name, n, u)
				}
				need("nats-ca-file")
			}
		}
	})
	for _, o := range x.byKind["EnvoyExtensionPolicy"] {
		for _, e := range list(o.Obj, "spec", "extProc") {
			for _, b := range list(e, "backendRefs") {
				ok := false
				for _, t := range x.byKind["BackendTLSPolicy"] {
					ok = ok || (t.Namespace() == o.Namespace() && targets(t, "Service", str(b, "name")))
				}
				if !ok {
					x.fail(o, "tls", "ext_proc backend %q: no BackendTLSPolicy, so Envoy would speak plaintext gRPC to it", str(b, "name"))
				}
			}
		}
	}
	for _, p := range x.pods {
		for _, c := range p.spec.Containers {
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			if strings.Contains(c.Image, "etcd") {
				for _, k := range []string{"ETCD_LISTEN_CLIENT_URLS", "ETCD_LISTEN_PEER_URLS"} {
					if !strings.HasPrefix(env[k], "https://") {
						x.fail(p.owner, "tls", "container %s: %s %q is not https://", c.Name, k, env[k])
					}
				}
				if env["ETCD_CLIENT_CERT_AUTH"] != "true" || env["ETCD_TRUSTED_CA_FILE"] == "" {
					x.fail(p.owner, "tls", "container %s: etcd without client-certificate auth", c.Name)
				}
			}
		}
	}
	for _, o := range x.byKind["ConfigMap"] {
		if conf, ok := get(o.Obj, "data", "nats.conf").(string); ok && (!strings.Contains(conf, "tls {") || !strings.Contains(conf, "verify: true")) {
			x.fail(o, "tls", "nats.conf: no tls block verifying clients")
		}
	}
}

// poolsConfig is the part of kvgate's pools.yaml the checks read.
type poolsConfig struct {
	Pools []struct {
		Name      string `json:"name"`
		BlockSize int    `json:"block_size"`
	} `json:"pools"`
}

func (x *index) poolBlockSizes() (map[string]int, bool) {
	for _, o := range x.byKind["ConfigMap"] {
		data, ok := get(o.Obj, "data", "pools.yaml").(string)
		if !ok {
			continue
		}
		var pc poolsConfig
		if err := yaml.Unmarshal([]byte(data), &pc); err != nil {
			x.fail(o, "block-size", "pools.yaml: %v", err)
			return nil, false
		}
		out := map[string]int{}
		for _, p := range pc.Pools {
			bs := p.BlockSize
			if bs == 0 {
				bs = 16
			}
			out[p.Name] = bs
		}
		return out, true
	}
	return nil, false
}

// checkBlockSizes: a pool's block size is one number, in the pools config,
// its local routers' -block-size, its relays' -block-size and its engines'
// block size (mocker -block-size, vLLM --block-size) in the relay's pod.
func (x *index) checkBlockSizes() {
	pools, ok := x.poolBlockSizes()
	if !ok {
		return
	}
	x.kvgateContainers(func(p pod, c corev1.Container, sub string) {
		if sub != "localrouter" && sub != "relay" {
			return
		}
		pool := flagValue(c.Args, "pool")
		want, known := pools[pool]
		if !known {
			x.fail(p.owner, "block-size", "container %s: -pool %q is not in pools.yaml", c.Name, pool)
			return
		}
		if got := flagValue(c.Args, "block-size"); got != strconv.Itoa(want) {
			x.fail(p.owner, "block-size", "container %s: -block-size %q, pool %s has block_size %d", c.Name, got, pool, want)
		}
		if sub != "relay" {
			return
		}
		for _, e := range p.spec.Containers {
			if e.Name == c.Name {
				continue
			}
			var got string
			switch {
			case isKvgateImage(e.Image) && len(e.Args) > 0 && e.Args[0] == "mocker":
				got = flagValue(e.Args, "block-size")
			case strings.Contains(e.Image, "vllm"):
				got = flagValue(append(slices.Clone(e.Command), e.Args...), "block-size")
			default:
				continue
			}
			if got != strconv.Itoa(want) {
				x.fail(p.owner, "block-size", "engine container %s: block size %q, pool %s has block_size %d", e.Name, got, pool, want)
			}
		}
	})
}

// checkEngines: a vLLM engine next to a relay publishes KV events where the
// relay listens, with prefix caching on.
func (x *index) checkEngines() {
	for _, p := range x.pods {
		var relay *corev1.Container
		for i, c := range p.spec.Containers {
			if isKvgateImage(c.Image) && len(c.Args) > 0 && c.Args[0] == "relay" {
				relay = &p.spec.Containers[i]
			}
		}
		for _, c := range p.spec.Containers {
			if !strings.Contains(c.Image, "vllm") {
				continue
			}
			args := append(slices.Clone(c.Command), c.Args...)
			if relay == nil {
				x.fail(p.owner, "engine", "vLLM container %s has no kvgate relay sidecar", c.Name)
				continue
			}
			if flagValue(args, "enable-prefix-caching") == "" {
				x.fail(p.owner, "engine", "vLLM container %s: --enable-prefix-caching not set", c.Name)
			}
			var kc struct {
				Enable    bool   `json:"enable_kv_cache_events"`
				Publisher string `json:"publisher"`
				Endpoint  string `json:"endpoint"`
				Replay    string `json:"replay_endpoint"`
				Topic     string `json:"topic"`
			}
			raw := flagValue(args, "kv-events-config")
			if err := json.Unmarshal([]byte(raw), &kc); err != nil {
				x.fail(p.owner, "engine", "vLLM container %s: --kv-events-config %q: %v", c.Name, raw, err)
				continue
			}
			if !kc.Enable || kc.Publisher != "zmq" {
				x.fail(p.owner, "engine", "vLLM container %s: --kv-events-config wants enable_kv_cache_events true and publisher zmq, got %+v", c.Name, kc)
			}
			if port(kc.Endpoint) != port(flagValue(relay.Args, "zmq")) || kc.Topic != flagValue(relay.Args, "topic") {
				x.fail(p.owner, "engine", "vLLM publishes on %s topic %q, the relay subscribes to %s topic %q", kc.Endpoint, kc.Topic, flagValue(relay.Args, "zmq"), flagValue(relay.Args, "topic"))
			}
		}
	}
}

func port(endpoint string) string {
	if i := strings.LastIndex(endpoint, ":"); i >= 0 {
		return endpoint[i+1:]
	}
	return ""
}

// checkFlags: every flag given to kvgate exists on its subcommand. A flag
// in Pending that the binary lacks is reported as "[flags-pending]".
func (x *index) checkFlags(flags Flags) {
	x.kvgateContainers(func(p pod, c corev1.Container, sub string) {
		known, ok := flags[sub]
		if !ok {
			x.fail(p.owner, "flags", "container %s: kvgate has no subcommand %q", c.Name, sub)
			return
		}
		for _, a := range c.Args[1:] {
			if !strings.HasPrefix(a, "-") {
				x.fail(p.owner, "flags", "container %s: argument %q is not a flag", c.Name, a)
				continue
			}
			n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if known[n] {
				continue
			}
			if Pending[n] {
				x.fail(p.owner, "flags-pending", "container %s: kvgate %s has no -%s yet (issue 11)", c.Name, sub, n)
				continue
			}
			x.fail(p.owner, "flags", "container %s: kvgate %s has no flag -%s", c.Name, sub, n)
		}
	})
}
