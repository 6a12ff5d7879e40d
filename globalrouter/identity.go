package globalrouter

import (
	"fmt"
	"maps"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/lib/xfcc"
	"github.com/kvgate/kvgate/policies"
)

// Identity says where a request's tenant comes from (tenancy.identity).
type Identity string

// Identity sources.
const (
	// IdentityTrusted: the tenant header, believed only from a trusted
	// caller (a trust token); any other request naming a tenant is 403.
	IdentityTrusted Identity = "trusted"
	// IdentityOn: the tenant header from every caller (a gateway that
	// always overwrites it, and no one else reaching the ext_proc port).
	IdentityOn Identity = "on"
	// IdentityXFCC: the client certificate Envoy forwards in
	// x-forwarded-client-cert (tenancy.xfcc says which SAN names the
	// tenant), believed only from a trusted Envoy (a trust token, or the
	// ext_proc connection's own mutual TLS).
	IdentityXFCC Identity = "xfcc"
	// IdentityJWTClaim: a claim of the JWT Envoy's jwt_authn filter
	// verified, read from the dynamic metadata Envoy sends the ext_proc
	// server (tenancy.jwt), believed only from a trusted Envoy as above.
	IdentityJWTClaim Identity = "jwt-claim"
)

// XFCCHeader is the header Envoy forwards the client certificate in.
const XFCCHeader = "x-forwarded-client-cert"

// JWTAuthnNamespace is the dynamic metadata namespace of Envoy's jwt_authn
// filter: under it, each provider's payload_in_metadata key holds the
// verified payload (envoyproxy/envoy
// source/extensions/filters/http/jwt_authn/filter.cc, Filter::
// setExtractedData, 0016b9515b1b095f154693c0bda8f2204236e26c; Envoy
// Gateway v1.9.1 internal/xds/translator/jwt.go sets payload_in_metadata
// to the provider's name, and its ext_proc policy's
// metadata.accessibleNamespaces forwards the namespace:
// api/v1alpha1/ext_proc_types.go, internal/xds/translator/extproc.go).
const JWTAuthnNamespace = "envoy.filters.http.jwt_authn"

// XFCCIdentity says which SAN of the client certificate names the tenant.
type XFCCIdentity struct {
	// SAN is "uri" (a URI SAN, e.g. a SPIFFE ID) or "dns".
	SAN string `yaml:"san"`
	// Prefix (san: uri): the tenant is the path segment right after it:
	// prefix spiffe://cluster.local/ns/ reads team-a from
	// spiffe://cluster.local/ns/team-a/sa/app.
	Prefix string `yaml:"prefix"`
	// Suffix (san: dns): the tenant is the DNS label right before it:
	// suffix .tenants.example.com reads team-a from
	// team-a.tenants.example.com.
	Suffix string `yaml:"suffix"`
}

// JWTIdentity names the claim that holds the tenant.
type JWTIdentity struct {
	// Provider is the jwt_authn provider's payload_in_metadata key
	// (Envoy Gateway: the SecurityPolicy's jwt.providers[].name).
	Provider string `yaml:"provider"`
	// Claim is a top-level claim of the payload, a string.
	Claim string `yaml:"claim"`
}

func (t *TenancyConfig) validateIdentity(where string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s: %w: "+format, append([]any{where, policies.ErrConfig}, a...)...)
	}
	if t.Identity == "" {
		t.Identity = IdentityTrusted
	}
	switch t.Identity {
	case IdentityTrusted, IdentityOn:
	case IdentityXFCC, IdentityJWTClaim:
		if t.Header == "" {
			return bad("tenancy.identity %s needs tenancy.header (the header the tenant is written to, for policies and salting)", t.Identity)
		}
	default:
		return bad("tenancy.identity %q: want trusted, on, xfcc or jwt-claim", t.Identity)
	}
	x, j := t.XFCC, t.JWT
	switch {
	case x != nil && t.Identity != IdentityXFCC:
		return bad("tenancy.xfcc is read only with tenancy.identity xfcc (it is %s)", t.Identity)
	case j != nil && t.Identity != IdentityJWTClaim:
		return bad("tenancy.jwt is read only with tenancy.identity jwt-claim (it is %s)", t.Identity)
	case t.Identity == IdentityXFCC && x == nil:
		return bad("tenancy.identity xfcc needs tenancy.xfcc {san, prefix or suffix}")
	case t.Identity == IdentityJWTClaim && (j == nil || j.Provider == "" || j.Claim == ""):
		return bad("tenancy.identity jwt-claim needs tenancy.jwt {provider, claim}")
	}
	if x != nil {
		switch {
		case x.SAN == "uri" && x.Prefix == "":
			return bad("tenancy.xfcc.prefix: san uri needs the prefix before the tenant's segment (e.g. spiffe://cluster.local/ns/)")
		case x.SAN == "uri" && x.Suffix != "":
			return bad("tenancy.xfcc.suffix is for san dns")
		case x.SAN == "dns" && (x.Suffix == "" || !strings.HasPrefix(x.Suffix, ".")):
			return bad("tenancy.xfcc.suffix: san dns needs the suffix after the tenant's label, beginning with a dot (e.g. .tenants.example.com)")
		case x.SAN == "dns" && x.Prefix != "":
			return bad("tenancy.xfcc.prefix is for san uri")
		case x.SAN != "uri" && x.SAN != "dns":
			return bad("tenancy.xfcc.san %q: want uri or dns", x.SAN)
		}
	}
	return nil
}

// tenant is the request's tenant ("" for none), derived once per
// decision from the configuration snapshot the decision holds (decide),
// so that a reload can never pair one configuration's identity with
// another's salting or policies. trusted says the caller carries a trust
// token.
//
// Under trusted the tenant header is believed only from a trusted caller
// (any other request naming a tenant is 403 untrusted_header); under on
// from every caller. Under xfcc and jwt-claim the tenant is read from the
// client certificate or the JWT claim, believed only from a trusted Envoy
// (a trust token or the ext_proc connection's mutual TLS: 403
// untrusted_identity), and a request without one is 403
// missing_identity; the client's own copy of the tenant header counts
// for nothing.
func (t *TenancyConfig) tenant(req *Request, trusted bool) (string, error) {
	if t.Header == "" {
		return "", nil
	}
	h := req.Headers
	switch t.Identity {
	case IdentityOn:
		return h[t.Header], nil
	case IdentityXFCC:
		return t.XFCC.tenant(h[XFCCHeader], trusted || req.PeerVerified)
	case IdentityJWTClaim:
		return t.JWT.tenant(req.JWTAuthn, trusted || req.PeerVerified)
	}
	if v := h[t.Header]; v != "" && !trusted {
		return "", &Refusal{Kind: ErrForbidden, Reason: "untrusted_header", Public: t.Header + " is honoured from trusted callers only (the gateway sets it)"}
	}
	return h[t.Header], nil
}

// checkExtraKey refuses SGLang's extra_key when tenants are salted.
func (t *TenancyConfig) checkExtraKey(req *Request) error {
	if t.Salt && req.ExtraKey != "" {
		// SGLang keys its cache by cache_salt + extra_key, concatenated
		// (python/sglang/srt/entrypoints/openai/serving_base.py
		// _compute_extra_key, c5695a4be1c4f84791eeaceeb6e4a775f8e7d0cc):
		// tenant "a" with extra_key "b" would read tenant "ab"'s cache.
		return fmt.Errorf("%w: extra_key: SGLang appends it to cache_salt, so with tenancy salting on it could spell another tenant's salt; send cache_salt instead", ErrBadRequest)
	}
	return nil
}

// view is the policies' view of the request's headers: the tenant
// tenancy derived, under the tenant header's name (policies.Request.
// Header). Headers are the request's own, not copied, unless the client
// sent a tenant header the derived tenant replaces (xfcc, jwt-claim): no
// policy sees a tenant the router does not believe.
func (t *TenancyConfig) view(v *policies.Request, tenant string) {
	v.TenantHeader, v.Tenant = t.Header, tenant
	if got, ok := v.Headers[t.Header]; ok && t.Header != "" && got != tenant {
		v.Headers = maps.Clone(v.Headers)
		v.Headers[t.Header] = tenant
	}
}

func untrustedIdentity(what string) *Refusal {
	return &Refusal{Kind: ErrForbidden, Reason: "untrusted_identity", Public: what + " is believed only from a trusted Envoy (a trust token or the ext_proc connection's mutual TLS)"}
}

func missingIdentity(msg string) *Refusal {
	return &Refusal{Kind: ErrForbidden, Reason: "missing_identity", Public: msg}
}

// tenant reads the tenant from an XFCC header: the last element (the one
// the Envoy in front of kvgate wrote, in SanitizeSet and AppendForward
// alike), its SANs of the configured kind that carry the prefix or
// suffix, all naming the same tenant.
func (x *XFCCIdentity) tenant(v string, trusted bool) (string, error) {
	if v != "" && !trusted {
		return "", untrustedIdentity(XFCCHeader)
	}
	if v == "" {
		return "", missingIdentity("no client certificate: " + XFCCHeader + " is absent (tenancy.identity xfcc)")
	}
	es, err := xfcc.Parse(v)
	if err != nil {
		return "", &Refusal{Kind: ErrForbidden, Reason: "bad_identity", Public: "the client certificate cannot be read", Err: err}
	}
	if len(es) == 0 { // blank: Envoy never writes one
		return "", missingIdentity("no client certificate: " + XFCCHeader + " is blank (tenancy.identity xfcc)")
	}
	e := es[len(es)-1]
	sans := e.URI
	if x.SAN == "dns" {
		sans = e.DNS
	}
	tenant := ""
	for _, s := range sans {
		t, ok := x.read(s)
		if !ok {
			continue
		}
		if tenant != "" && t != tenant {
			return "", missingIdentity(fmt.Sprintf("the client certificate names two tenants (%q and %q)", tenant, t))
		}
		tenant = t
	}
	if tenant == "" {
		what := "prefix " + x.Prefix
		if x.SAN == "dns" {
			what = "suffix " + x.Suffix
		}
		return "", missingIdentity(fmt.Sprintf("the client certificate has no %s SAN with the %s (tenancy.xfcc)", strings.ToUpper(x.SAN), what))
	}
	return tenant, nil
}

// read is the tenant one SAN names, if it has the prefix (a non-empty
// segment after it) or the suffix (a non-empty label before it).
func (x *XFCCIdentity) read(san string) (string, bool) {
	if x.SAN == "dns" {
		rest, ok := strings.CutSuffix(strings.ToLower(san), strings.ToLower(x.Suffix))
		if !ok || rest == "" {
			return "", false
		}
		if i := strings.LastIndexByte(rest, '.'); i >= 0 {
			return "", false // more than one label: not a tenant of this suffix
		}
		return rest, true
	}
	rest, ok := strings.CutPrefix(san, x.Prefix)
	if !ok {
		return "", false
	}
	seg, _, _ := strings.Cut(rest, "/")
	seg, _, _ = strings.Cut(seg, "?")
	seg, _, _ = strings.Cut(seg, "#")
	return seg, seg != ""
}

// tenant reads the tenant claim from the jwt_authn filter's metadata.
func (j *JWTIdentity) tenant(md *structpb.Struct, trusted bool) (string, error) {
	payload := md.GetFields()[j.Provider].GetStructValue()
	if payload != nil && !trusted {
		return "", untrustedIdentity("the " + JWTAuthnNamespace + " metadata")
	}
	if payload == nil {
		return "", missingIdentity(fmt.Sprintf("no verified JWT of provider %q (tenancy.jwt)", j.Provider))
	}
	v, ok := payload.GetFields()[j.Claim]
	if !ok {
		return "", missingIdentity(fmt.Sprintf("the JWT has no claim %q (tenancy.jwt)", j.Claim))
	}
	s, isString := v.GetKind().(*structpb.Value_StringValue)
	if !isString || s.StringValue == "" || strings.ContainsRune(s.StringValue, 0) {
		// A NUL separates the tenant from the client's salt
		// (TenancyConfig.salt): a tenant holding one could spell another
		// tenant's salt and client salt.
		return "", missingIdentity(fmt.Sprintf("the JWT's claim %q is not a non-empty string without NUL", j.Claim))
	}
	return s.StringValue, nil
}
