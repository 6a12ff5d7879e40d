package validate

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

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
