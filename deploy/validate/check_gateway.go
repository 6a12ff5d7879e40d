package validate

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

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
