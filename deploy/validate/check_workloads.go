package validate

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

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
