package validate

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// RoutingSidecarImage is the name (without registry and tag) of llm-d's
// P/D routing sidecar image: llm-d/llm-d-inference-scheduler builds
// cmd/pd-sidecar as ghcr.io/llm-d/llm-d-routing-sidecar (its Makefile's
// SIDECAR_IMAGE_NAME).
const RoutingSidecarImage = "llm-d-routing-sidecar"

// RoutingSidecarSource is where RoutingSidecarFlags were read.
const RoutingSidecarSource = "llm-d/llm-d-inference-scheduler cmd/pd-sidecar/main.go @ d412f5824b938566d8dc0f816ebbec1aa2e2bcbe"

// SidecarFlag is one command-line flag of the routing sidecar: its type in
// Go's flag package and its default ("$VAR": read from that environment
// variable).
type SidecarFlag struct {
	Kind    string // "bool", "int" or "string"
	Default string
}

// RoutingSidecarFlags are the routing sidecar's flags: its own
// (pdSidecarFlags) and klog's (klogFlags). A flag given to a sidecar
// container that is not here is an error: Go's flag package would make the
// sidecar exit with "flag provided but not defined".
var RoutingSidecarFlags = func() map[string]SidecarFlag {
	m := map[string]SidecarFlag{}
	for _, t := range []map[string]SidecarFlag{pdSidecarFlags, klogFlags} {
		for k, v := range t {
			m[k] = v
		}
	}
	return m
}()

// pdSidecarFlags are the flags RoutingSidecarSource defines
// (flag.String/Bool/Int in main, parsed by Go's flag package).
var pdSidecarFlags = map[string]SidecarFlag{
	"port":                               {"string", "8000"},
	"vllm-port":                          {"string", "8001"},
	"data-parallel-size":                 {"int", "1"},
	"connector":                          {"string", "nixlv2"},
	"prefiller-use-tls":                  {"bool", "false"},
	"decoder-use-tls":                    {"bool", "false"},
	"prefiller-tls-insecure-skip-verify": {"bool", "false"},
	"decoder-tls-insecure-skip-verify":   {"bool", "false"},
	"secure-proxy":                       {"bool", "true"},
	"cert-path":                          {"string", ""},
	"enable-ssrf-protection":             {"bool", "false"},
	"inference-pool-namespace":           {"string", "$INFERENCE_POOL_NAMESPACE"},
	"inference-pool-name":                {"string", "$INFERENCE_POOL_NAME"},
}

// klogFlags are the flags klog.InitFlags(nil) adds in RoutingSidecarSource
// (k8s.io/klog/v2 klog.go): the ones every klog v2 release has; newer
// releases add more, which this list leaves out on purpose (the sidecar's
// klog version is not known here). pd_test.go checks each against klog's
// own InitFlags.
var klogFlags = map[string]SidecarFlag{
	"v":                 {"int", "0"},
	"vmodule":           {"string", ""},
	"logtostderr":       {"bool", "true"},
	"alsologtostderr":   {"bool", "false"},
	"stderrthreshold":   {"string", "2"},
	"log_dir":           {"string", ""},
	"log_file":          {"string", ""},
	"log_file_max_size": {"int", "1800"},
	"log_backtrace_at":  {"string", ":0"},
	"add_dir_header":    {"bool", "false"},
	"skip_headers":      {"bool", "false"},
	"skip_log_headers":  {"bool", "false"},
	"one_output":        {"bool", "false"},
}

// RoutingSidecarConnectors are the values -connector accepts
// (supportedConnectors in RoutingSidecarSource: proxy.ConnectorNIXLV2,
// ConnectorLMCache, ConnectorSGLang).
var RoutingSidecarConnectors = []string{"nixlv2", "lmcache", "sglang"}

// ParseGoFlags parses args as Go's flag package does against known: -name
// or --name, -name=value, a non-bool flag's value as the next argument. It
// returns each flag's value and one error per problem; where Go's flag
// package would stop (a non-flag argument) it reports the rest as ignored.
func ParseGoFlags(args []string, known map[string]SidecarFlag) (map[string]string, []error) {
	got := map[string]string{}
	var errs []error
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			errs = append(errs, fmt.Errorf("argument %d %q is not a flag: Go's flag package stops there and ignores %d argument(s) after it (a bool flag takes its value as -name=value)", i, a, len(args)-i-1))
			break
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		name, value, hasValue := strings.Cut(name, "=")
		if name == "" || name[0] == '-' || name[0] == '=' {
			errs = append(errs, fmt.Errorf("argument %d %q: bad flag syntax", i, a))
			continue
		}
		f, ok := known[name]
		if !ok {
			errs = append(errs, fmt.Errorf("argument %d: no flag -%s", i, name))
			continue
		}
		if !hasValue && f.Kind != "bool" {
			if i+1 >= len(args) {
				errs = append(errs, fmt.Errorf("argument %d: flag -%s needs a value", i, name))
				continue
			}
			i++
			value = args[i]
		} else if !hasValue {
			value = "true"
		}
		if _, dup := got[name]; dup {
			errs = append(errs, fmt.Errorf("argument %d: flag -%s given twice (the last wins)", i, name))
		}
		switch f.Kind {
		case "bool":
			if _, err := strconv.ParseBool(value); err != nil {
				errs = append(errs, fmt.Errorf("flag -%s: %q is not a bool", name, value))
			}
		case "int":
			if _, err := strconv.Atoi(value); err != nil {
				errs = append(errs, fmt.Errorf("flag -%s: %q is not an int", name, value))
			}
		}
		got[name] = value
	}
	return got, errs
}

// sidecarValue is flag name's value: given, else its default.
func sidecarValue(got map[string]string, name string, env []corev1.EnvVar) string {
	if v, ok := got[name]; ok {
		return v
	}
	d := RoutingSidecarFlags[name].Default
	if strings.HasPrefix(d, "$") {
		for _, e := range env {
			if e.Name == d[1:] {
				return orDefault(e.Value, "from "+d)
			}
		}
		return ""
	}
	return d
}

func isImage(image, name string) bool {
	base := image
	if i := strings.LastIndex(base, "/"); i >= 0 {
		base = base[i+1:]
	}
	base, _, _ = strings.Cut(base, "@")
	base, _, _ = strings.Cut(base, ":")
	return base == name
}

func isVLLM(c corev1.Container) bool { return strings.Contains(c.Image, "vllm") }

func engineArgs(c corev1.Container) []string { return append(slices.Clone(c.Command), c.Args...) }

// vllmPort is a vLLM container's --port (vLLM's default 8000).
func vllmPort(c corev1.Container) string { return orDefault(flagValue(engineArgs(c), "port"), "8000") }

// containerPort resolves a port (name or number) of c to its number.
func containerPort(c corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// kvTransferConfig is the part of vLLM's --kv-transfer-config
// (KVTransferConfig) the checks read.
type kvTransferConfig struct {
	Connector string `json:"kv_connector"`
	Role      string `json:"kv_role"`
}

// checkPD: the pods of a disaggregated topology with real engines. Every
// routing sidecar's flags exist (RoutingSidecarFlags) and hold valid
// values; it listens on a declared port that the relay registers and every
// Service targets, in front of the pod's vLLM on --vllm-port; vLLM engines
// of the prefill and decode roles carry a NixlConnector --kv-transfer-config
// and a NIXL side-channel host other pods can reach; a decode engine has a
// sidecar (without one, x-prefiller-host-port is ignored); a sidecar
// without SSRF protection is behind a NetworkPolicy that admits chosen
// sources only to its port.
func (x *index) checkPD() {
	x.checkNetworkPolicies()
	for _, p := range x.pods {
		var relay, engine, sidecar *corev1.Container
		for i, c := range p.spec.Containers {
			switch {
			case isKvgateImage(c.Image) && len(c.Args) > 0 && c.Args[0] == "relay":
				relay = &p.spec.Containers[i]
			case isImage(c.Image, RoutingSidecarImage):
				sidecar = &p.spec.Containers[i]
			case isVLLM(c):
				engine = &p.spec.Containers[i]
			}
		}
		if sidecar != nil {
			x.checkSidecar(p, *sidecar, engine, relay)
		}
		if engine == nil || relay == nil {
			continue
		}
		role := flagValue(relay.Args, "role")
		if role != "prefill" && role != "decode" {
			continue
		}
		x.checkKVTransfer(p, *engine, role)
		if role == "decode" && sidecar == nil {
			x.fail(p.owner, "pd", "vLLM decode worker %s has no llm-d routing sidecar (%s): the engine ignores x-prefiller-host-port and prefills every prompt itself", engine.Name, RoutingSidecarImage)
		}
		if sidecar == nil && port(flagValue(relay.Args, "address")) != vllmPort(*engine) {
			x.fail(p.owner, "pd", "relay -address %q registers a port other than vLLM's --port %s", flagValue(relay.Args, "address"), vllmPort(*engine))
		}
	}
}

func (x *index) checkKVTransfer(p pod, c corev1.Container, role string) {
	raw := flagValue(engineArgs(c), "kv-transfer-config")
	var kt kvTransferConfig
	if raw == "" || raw == "true" {
		x.fail(p.owner, "pd", "vLLM %s worker %s: no --kv-transfer-config={...} (vLLM's NixlConnector: {\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"})", role, c.Name)
		return
	}
	if err := json.Unmarshal([]byte(raw), &kt); err != nil {
		x.fail(p.owner, "pd", "vLLM %s worker %s: --kv-transfer-config %q: %v", role, c.Name, raw, err)
		return
	}
	want := map[string][]string{"prefill": {"kv_both", "kv_producer"}, "decode": {"kv_both", "kv_consumer"}}[role]
	if kt.Connector != "NixlConnector" || !slices.Contains(want, kt.Role) {
		x.fail(p.owner, "pd", "vLLM %s worker %s: --kv-transfer-config has kv_connector %q kv_role %q, want NixlConnector and one of %v", role, c.Name, kt.Connector, kt.Role, want)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "VLLM_NIXL_SIDE_CHANNEL_HOST" }) {
		x.fail(p.owner, "pd", "vLLM %s worker %s: VLLM_NIXL_SIDE_CHANNEL_HOST not set (default localhost: a peer in another pod cannot reach the NIXL handshake)", role, c.Name)
	}
}

func (x *index) checkSidecar(p pod, c corev1.Container, engine, relay *corev1.Container) {
	fail := func(format string, a ...any) {
		x.fail(p.owner, "pd-sidecar", "container %s: %s", c.Name, fmt.Sprintf(format, a...))
	}
	if len(c.Command) > 0 {
		fail("command %q replaces the image's entrypoint; give the flags as args", c.Command)
	}
	got, errs := ParseGoFlags(c.Args, RoutingSidecarFlags)
	for _, err := range errs {
		fail("%v (the flags of %s)", err, RoutingSidecarSource)
	}
	if v := sidecarValue(got, "connector", c.Env); !slices.Contains(RoutingSidecarConnectors, v) {
		fail("--connector %q: want one of %v", v, RoutingSidecarConnectors)
	}
	if b, _ := strconv.ParseBool(sidecarValue(got, "secure-proxy", c.Env)); b {
		fail("--secure-proxy is true (its default): the sidecar serves TLS with a self-signed certificate, but Envoy sends plaintext HTTP to the workers; set --secure-proxy=false")
	}
	if b, _ := strconv.ParseBool(sidecarValue(got, "enable-ssrf-protection", c.Env)); b {
		for _, f := range []string{"inference-pool-namespace", "inference-pool-name"} {
			if sidecarValue(got, f, c.Env) == "" {
				fail("--enable-ssrf-protection needs --%s (or its environment variable)", f)
			}
		}
	}
	sport := sidecarValue(got, "port", c.Env)
	n, err := strconv.Atoi(sport)
	if err != nil || n < 1 || n > 65535 {
		fail("--port %q is not a port", sport)
		return
	}
	if _, ok := containerPort(c, intstr.FromInt32(int32(n))); !ok {
		fail("listens on --port %d, which the container does not declare", n)
	}
	if engine == nil {
		fail("no vLLM container in the pod for it to forward to")
	} else if vp := sidecarValue(got, "vllm-port", c.Env); vp != vllmPort(*engine) {
		fail("--vllm-port %s, but vLLM container %s listens on --port %s", vp, engine.Name, vllmPort(*engine))
	} else if vp == sport {
		fail("--port and --vllm-port are both %s", sport)
	}
	if b, _ := strconv.ParseBool(sidecarValue(got, "enable-ssrf-protection", c.Env)); !b {
		x.checkSidecarIngress(p, c, int32(n))
	}
	if relay != nil && port(flagValue(relay.Args, "address")) != sport {
		fail("the relay registers -address %q, not the sidecar's port %s: kvgate would send this worker's requests past the sidecar", flagValue(relay.Args, "address"), sport)
	}
	for _, o := range x.byKind["Service"] {
		s := x.services[o.Namespace()+"/"+o.Name()]
		if s == nil || len(s.Spec.Selector) == 0 || !slices.ContainsFunc(x.podsOf(o.Namespace(), s.Spec.Selector), func(q pod) bool { return q.owner.Name() == p.owner.Name() && q.owner.Kind() == p.owner.Kind() }) {
			continue
		}
		for _, sp := range s.Spec.Ports {
			tp := sp.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(sp.Port)
			}
			if got, ok := containerPort(c, tp); !ok || got != int32(n) {
				x.fail(o, "pd-sidecar", "port %s (targetPort %s) does not reach the routing sidecar's --port %d on %s: requests would bypass it", sp.Name, tp.String(), n, p.owner)
			}
		}
	}
}

// checkReadiness: every container that runs for the pod's life (the
// containers, and init containers with restartPolicy Always, Kubernetes'
// native sidecars) has a readiness probe: a pod is in its Services'
// endpoints only while all of them are ready.
func (x *index) checkReadiness() {
	for _, p := range x.pods {
		for _, c := range p.spec.InitContainers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways && c.ReadinessProbe == nil {
				x.fail(p.owner, "readiness", "sidecar init container %s has no readinessProbe", c.Name)
			}
		}
		for _, c := range p.spec.Containers {
			if c.ReadinessProbe == nil {
				x.fail(p.owner, "readiness", "container %s has no readinessProbe", c.Name)
			}
		}
	}
}

// networkPolicies returns the NetworkPolicies of ns, decoded.
func (x *index) networkPolicies(ns string) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for _, o := range x.byKind["NetworkPolicy"] {
		if o.Namespace() != ns {
			continue
		}
		if ro, err := decodeCore(o); err == nil {
			out = append(out, ro.(*networkingv1.NetworkPolicy))
		}
	}
	return out
}

func selects(sel *metav1.LabelSelector, lbl map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(lbl))
}

// checkSidecarIngress: a routing sidecar without SSRF protection sends a
// prefill request wherever x-prefiller-host-port points, so a
// NetworkPolicy must select its pod for ingress, and no rule may admit
// every source to its port.
func (x *index) checkSidecarIngress(p pod, c corev1.Container, n int32) {
	covered := false
	for _, np := range x.networkPolicies(p.owner.Namespace()) {
		ingress := len(np.Spec.PolicyTypes) == 0 || slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		if !ingress || !selects(&np.Spec.PodSelector, p.labels) {
			continue
		}
		covered = true
		for i, r := range np.Spec.Ingress {
			if len(r.From) == 0 && portsCover(r.Ports, c, n) {
				x.fail(p.owner, "pd-sidecar", "container %s: NetworkPolicy %s ingress[%d] admits every source to the sidecar's port %d, and --enable-ssrf-protection is false: any pod could have it send requests to any host", c.Name, np.Name, i, n)
			}
		}
	}
	if !covered {
		x.fail(p.owner, "pd-sidecar", "container %s: --enable-ssrf-protection is false and no NetworkPolicy limits who reaches port %d: any pod could have the sidecar send requests to any host (x-prefiller-host-port)", c.Name, n)
	}
}

// portsCover reports whether a NetworkPolicy rule's ports admit TCP port n
// of c (no ports: every port).
func portsCover(ports []networkingv1.NetworkPolicyPort, c corev1.Container, n int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		if pp.Protocol != nil && *pp.Protocol != corev1.ProtocolTCP {
			continue
		}
		if pp.Port == nil {
			return true
		}
		lo, ok := containerPort(c, *pp.Port)
		if pp.Port.Type == intstr.Int {
			lo, ok = pp.Port.IntVal, true
		}
		hi := lo
		if pp.EndPort != nil {
			hi = *pp.EndPort
		}
		if ok && lo <= n && n <= hi {
			return true
		}
	}
	return false
}

// checkNetworkPolicies: a NetworkPolicy selects at least one pod.
func (x *index) checkNetworkPolicies() {
	for _, o := range x.byKind["NetworkPolicy"] {
		ro, err := decodeCore(o)
		if err != nil {
			continue
		}
		np := ro.(*networkingv1.NetworkPolicy)
		if !slices.ContainsFunc(x.pods, func(p pod) bool {
			return p.owner.Namespace() == o.Namespace() && selects(&np.Spec.PodSelector, p.labels)
		}) {
			x.fail(o, "selectors", "podSelector %v matches no pod", np.Spec.PodSelector.MatchLabels)
		}
	}
}
