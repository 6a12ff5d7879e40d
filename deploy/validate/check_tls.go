package validate

import (
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

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
