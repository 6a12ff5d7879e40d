package app

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/lib/config"
)

// tenancyFlags are kvgate up's tenancy flags. -tenant-header turns tenancy
// on; the others are the configuration file's tenancy.identity, .xfcc and
// .jwt fields, each flag named after its field's path (tenancy.xfcc.prefix
// is -tenancy-xfcc-prefix) and meaning exactly what the field means
// (globalrouter.TenancyConfig, docs/security.md). All are read by the
// global router `kvgate up` starts.
type tenancyFlags struct {
	header, trust                                  string
	identity, san, prefix, suffix, provider, claim string
}

func (f *tenancyFlags) register(fs *config.FlagSet) {
	fs.StringVar(&f.header, "tenant-header", "", "turn tenancy on (read by the global router): the header naming the tenant (e.g. x-tenant); each tenant's blocks are salted, in the router and, as the body's cache_salt, in the engines; who may name a tenant: -tenancy-identity (docs/security.md)")
	fs.StringVar(&f.trust, "trust-token-sha256", "", "comma-separated hex SHA-256 digests of the trust tokens (x-kvgate-trust) of the callers the global router believes (the gateway's): they may name a tenant (-tenancy-identity trusted) or vouch for the client certificate or JWT they forward (xfcc, jwt-claim)")
	fs.StringVar(&f.identity, "tenancy-identity", "", "with -tenant-header, where the global router takes the tenant from (tenancy.identity): trusted (default: the header, from -trust-token-sha256 holders only), on (the header, from every caller), xfcc (the client certificate in x-forwarded-client-cert: -tenancy-xfcc-*), jwt-claim (a claim of the JWT Envoy's jwt_authn filter verified: -tenancy-jwt-*)")
	fs.StringVar(&f.san, "tenancy-xfcc-san", "", "read by the global router with -tenancy-identity xfcc (tenancy.xfcc.san): uri or dns, the kind of SAN naming the tenant (default: uri with -tenancy-xfcc-prefix, dns with -tenancy-xfcc-suffix)")
	fs.StringVar(&f.prefix, "tenancy-xfcc-prefix", "", "read by the global router with -tenancy-identity xfcc (tenancy.xfcc.prefix): the tenant is the path segment of a URI SAN right after this prefix (spiffe://cluster.local/ns/ reads team-a from spiffe://cluster.local/ns/team-a/sa/app)")
	fs.StringVar(&f.suffix, "tenancy-xfcc-suffix", "", "read by the global router with -tenancy-identity xfcc (tenancy.xfcc.suffix): the tenant is the DNS SAN's label right before this suffix, beginning with a dot (.tenants.example.com reads team-a from team-a.tenants.example.com)")
	fs.StringVar(&f.provider, "tenancy-jwt-provider", "", "read by the global router with -tenancy-identity jwt-claim (tenancy.jwt.provider): the jwt_authn provider whose verified payload holds the claim (Envoy Gateway: the SecurityPolicy's jwt.providers[].name)")
	fs.StringVar(&f.claim, "tenancy-jwt-claim", "", "read by the global router with -tenancy-identity jwt-claim (tenancy.jwt.claim): the top-level string claim naming the tenant")
}

// config is the tenancy section and trust tokens the flags say, or an
// error naming the flag of an inconsistent combination: a flag that the
// configuration it makes would not read is refused, not ignored.
func (f *tenancyFlags) config() (globalrouter.TenancyConfig, []string, error) {
	var tokens []string
	if f.trust != "" {
		tokens = strings.Split(f.trust, ",")
	}
	identity := globalrouter.Identity(f.identity)
	xfccFlags := map[string]string{"-tenancy-xfcc-san": f.san, "-tenancy-xfcc-prefix": f.prefix, "-tenancy-xfcc-suffix": f.suffix}
	jwtFlags := map[string]string{"-tenancy-jwt-provider": f.provider, "-tenancy-jwt-claim": f.claim}
	if f.header == "" {
		for _, name := range []string{"-tenancy-identity", "-tenancy-xfcc-san", "-tenancy-xfcc-prefix", "-tenancy-xfcc-suffix", "-tenancy-jwt-provider", "-tenancy-jwt-claim"} {
			if f.get(name) != "" {
				return globalrouter.TenancyConfig{}, nil, fmt.Errorf("%s needs -tenant-header: tenancy is off without it", name)
			}
		}
		return globalrouter.TenancyConfig{}, tokens, nil
	}
	switch identity {
	case "":
		identity = globalrouter.IdentityTrusted
	case globalrouter.IdentityTrusted, globalrouter.IdentityOn, globalrouter.IdentityXFCC, globalrouter.IdentityJWTClaim:
	default:
		return globalrouter.TenancyConfig{}, nil, fmt.Errorf("-tenancy-identity %q: want trusted, on, xfcc or jwt-claim", f.identity)
	}
	for _, group := range []struct {
		flags map[string]string
		want  globalrouter.Identity
	}{{xfccFlags, globalrouter.IdentityXFCC}, {jwtFlags, globalrouter.IdentityJWTClaim}} {
		for _, name := range slices.Sorted(maps.Keys(group.flags)) {
			if group.flags[name] != "" && identity != group.want {
				return globalrouter.TenancyConfig{}, nil, fmt.Errorf("%s is read only with -tenancy-identity %s (it is %s)", name, group.want, identity)
			}
		}
	}
	if identity != globalrouter.IdentityOn && f.trust == "" {
		// kvgate up's ext_proc hop has no mutual TLS (-secure-serving is
		// server TLS only), so the token is how the gateway vouches.
		what := "only trusted callers may name a tenant"
		if identity != globalrouter.IdentityTrusted {
			what = "the identity is believed only from a trusted Envoy, and kvgate up's ext_proc hop has no mutual TLS: the trust token is how the gateway vouches"
		}
		return globalrouter.TenancyConfig{}, nil, fmt.Errorf("-tenancy-identity %s needs -trust-token-sha256: %s", identity, what)
	}
	t := globalrouter.TenancyConfig{Header: f.header, Salt: true, Identity: identity}
	switch identity {
	case globalrouter.IdentityXFCC:
		x, err := f.xfcc()
		if err != nil {
			return globalrouter.TenancyConfig{}, nil, err
		}
		t.XFCC = x
	case globalrouter.IdentityJWTClaim:
		for _, name := range slices.Sorted(maps.Keys(jwtFlags)) {
			if jwtFlags[name] == "" {
				return globalrouter.TenancyConfig{}, nil, fmt.Errorf("-tenancy-identity jwt-claim needs %s", name)
			}
		}
		t.JWT = &globalrouter.JWTIdentity{Provider: f.provider, Claim: f.claim}
	}
	return t, tokens, nil
}

// xfcc is the tenancy.xfcc section of the -tenancy-xfcc-* flags.
func (f *tenancyFlags) xfcc() (*globalrouter.XFCCIdentity, error) {
	san := f.san
	switch {
	case f.prefix != "" && f.suffix != "":
		return nil, errors.New("-tenancy-xfcc-prefix and -tenancy-xfcc-suffix: give one (a URI SAN's prefix or a DNS SAN's suffix)")
	case f.prefix == "" && f.suffix == "":
		return nil, errors.New("-tenancy-identity xfcc needs -tenancy-xfcc-prefix (a URI SAN, e.g. spiffe://cluster.local/ns/) or -tenancy-xfcc-suffix (a DNS SAN, e.g. .tenants.example.com)")
	case san == "" && f.prefix != "":
		san = "uri"
	case san == "":
		san = "dns"
	}
	switch {
	case san != "uri" && san != "dns":
		return nil, fmt.Errorf("-tenancy-xfcc-san %q: want uri or dns", san)
	case san == "uri" && f.prefix == "":
		return nil, errors.New("-tenancy-xfcc-san uri needs -tenancy-xfcc-prefix, not -tenancy-xfcc-suffix")
	case san == "dns" && f.suffix == "":
		return nil, errors.New("-tenancy-xfcc-san dns needs -tenancy-xfcc-suffix, not -tenancy-xfcc-prefix")
	case san == "dns" && !strings.HasPrefix(f.suffix, "."):
		return nil, fmt.Errorf("-tenancy-xfcc-suffix %q: begin it with a dot (e.g. .tenants.example.com)", f.suffix)
	}
	return &globalrouter.XFCCIdentity{SAN: san, Prefix: f.prefix, Suffix: f.suffix}, nil
}

// get is the value of the flag name.
func (f *tenancyFlags) get(name string) string {
	return map[string]string{"-tenancy-identity": f.identity, "-tenancy-xfcc-san": f.san, "-tenancy-xfcc-prefix": f.prefix,
		"-tenancy-xfcc-suffix": f.suffix, "-tenancy-jwt-provider": f.provider, "-tenancy-jwt-claim": f.claim}[name]
}
