package validate

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// JWTAuthnNamespace is the dynamic metadata namespace of Envoy's
// jwt_authn filter (kvgate's globalrouter.JWTAuthnNamespace).
const JWTAuthnNamespace = "envoy.filters.http.jwt_authn"

// identityConfig is the part of kvgate's pools.yaml checkIdentity reads.
type identityConfig struct {
	Tenancy struct {
		Identity string `json:"identity"`
		XFCC     struct {
			SAN string `json:"san"`
		} `json:"xfcc"`
		JWT struct {
			Provider string `json:"provider"`
		} `json:"jwt"`
	} `json:"tenancy"`
	Trust struct {
		Tokens []string `json:"tokens_sha256"`
	} `json:"trust"`
}

// checkIdentity: a pools.yaml whose tenants come from Envoy
// (tenancy.identity xfcc or jwt-claim) needs the Envoy side that makes
// them, and an Envoy kvgate believes. kvgate believes the forwarded
// identity only from a caller whose client certificate the ext_proc
// server verified (-tls-client-ca-file), or one with a trust token: with
// the first, Envoy must present a certificate (Gateway
// spec.tls.backend.clientCertificateRef, or an EnvoyProxy's
// backendTLS.clientCertificateRef). xfcc needs a ClientTrafficPolicy that
// requires client certificates and writes x-forwarded-client-cert itself
// (SanitizeSet or AppendForward, with the SAN kind kvgate reads); jwt-claim
// a SecurityPolicy jwt provider of the configured name and an ext_proc
// policy forwarding the jwt_authn metadata. Without them every request is
// 403 (or, with a pass-through XFCC mode, a client names its own tenant).
func (x *index) checkIdentity() {
	for _, cm := range x.byKind["ConfigMap"] {
		data, ok := get(cm.Obj, "data", "pools.yaml").(string)
		if !ok {
			continue
		}
		var ic identityConfig
		if err := yaml.Unmarshal([]byte(data), &ic); err != nil {
			continue // checkBlockSizes reports it
		}
		id := ic.Tenancy.Identity
		if id != "xfcc" && id != "jwt-claim" {
			continue
		}
		mtls := false
		x.kvgateContainers(func(_ pod, c corev1.Container, sub string) {
			mtls = mtls || (sub == "extproc" && containerFlag(c, "tls-client-ca-file") != "")
		})
		switch {
		case !mtls && len(ic.Trust.Tokens) == 0:
			x.fail(cm, "identity", "tenancy.identity %s: the ext_proc server verifies no client certificate (-tls-client-ca-file) and trust.tokens_sha256 is empty: no Envoy can vouch for the identity, so every request is 403 untrusted_identity", id)
		case mtls && !x.envoyClientCertificate():
			x.fail(cm, "identity", "tenancy.identity %s: the ext_proc server requires a client certificate (-tls-client-ca-file) but Envoy presents none (no Gateway spec.tls.backend.clientCertificateRef, no EnvoyProxy backendTLS.clientCertificateRef)", id)
		}
		if id == "xfcc" {
			x.checkXFCC(cm, strings.ToUpper(orDefault(ic.Tenancy.XFCC.SAN, "uri")))
		} else {
			x.checkJWTIdentity(cm, ic.Tenancy.JWT.Provider)
		}
	}
}

// envoyClientCertificate: Envoy presents a client certificate to TLS
// backends.
func (x *index) envoyClientCertificate() bool {
	for _, g := range x.byKind["Gateway"] {
		if str(g.Obj, "spec", "tls", "backend", "clientCertificateRef", "name") != "" {
			return true
		}
	}
	for _, p := range x.byKind["EnvoyProxy"] {
		if str(p.Obj, "spec", "backendTLS", "clientCertificateRef", "name") != "" {
			return true
		}
	}
	return false
}

func (x *index) checkXFCC(cm Object, san string) {
	for _, p := range x.byKind["ClientTrafficPolicy"] {
		if !slices.ContainsFunc(list(p.Obj, "spec", "targetRefs"), func(t any) bool { return str(t, "kind") == "Gateway" }) {
			continue
		}
		mode := str(p.Obj, "spec", "headers", "xForwardedClientCert", "mode")
		switch {
		case len(list(p.Obj, "spec", "tls", "clientValidation", "caCertificateRefs")) == 0:
			x.fail(p, "identity", "tenancy.identity xfcc: tls.clientValidation has no caCertificateRefs: clients present no certificate to forward")
		case mode != "SanitizeSet" && mode != "AppendForward":
			x.fail(p, "identity", "tenancy.identity xfcc: headers.xForwardedClientCert.mode %q, want SanitizeSet or AppendForward: any other mode drops the certificate or passes a client's own x-forwarded-client-cert through", mode)
		case !slices.Contains(list(p.Obj, "spec", "headers", "xForwardedClientCert", "certDetailsToAdd"), any(san)):
			x.fail(p, "identity", "tenancy.identity xfcc: headers.xForwardedClientCert.certDetailsToAdd lacks %s, the SAN kind tenancy.xfcc.san reads", san)
		}
		return
	}
	x.fail(cm, "identity", "tenancy.identity xfcc: no ClientTrafficPolicy targets a Gateway (tls.clientValidation and headers.xForwardedClientCert): Envoy forwards no client certificate")
}

func (x *index) checkJWTIdentity(cm Object, provider string) {
	found := false
	for _, p := range x.byKind["SecurityPolicy"] {
		for _, pr := range list(p.Obj, "spec", "jwt", "providers") {
			found = found || str(pr, "name") == provider
		}
	}
	if !found {
		x.fail(cm, "identity", "tenancy.identity jwt-claim: no SecurityPolicy has a jwt provider named %q (tenancy.jwt.provider): no verified payload is left under that name", provider)
	}
	for _, o := range x.byKind["EnvoyExtensionPolicy"] {
		for _, e := range list(o.Obj, "spec", "extProc") {
			if !slices.Contains(list(e, "metadata", "accessibleNamespaces"), any(JWTAuthnNamespace)) {
				x.fail(o, "identity", "tenancy.identity jwt-claim: extProc metadata.accessibleNamespaces lacks %s: kvgate never sees the verified JWT", JWTAuthnNamespace)
			}
		}
	}
}

// containerFlag is the value of a kvgate flag in c's args, or else in its
// environment (KVGATE_<FLAG>, which every kvgate flag reads).
func containerFlag(c corev1.Container, name string) string {
	if v := flagValue(c.Args, name); v != "" {
		return v
	}
	env := "KVGATE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	for _, e := range c.Env {
		if e.Name == env {
			return e.Value
		}
	}
	return ""
}
