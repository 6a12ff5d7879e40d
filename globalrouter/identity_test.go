package globalrouter_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/tokenizer"
)

// An XFCC header as Envoy writes it in SanitizeSet mode with URI, DNS and
// Subject details (lib/xfcc cites the format).
func xfccOf(uris ...string) string {
	v := `By=spiffe://cluster.local/ns/gw/sa/envoy;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="CN=client,O=Acme \"Inc\""`
	for _, u := range uris {
		v += ";URI=" + u
	}
	return v + ";DNS=client.example.com"
}

// TestTenantFromXFCC: with tenancy.identity xfcc the tenant is the SPIFFE
// ID's namespace segment of the client certificate Envoy forwards, believed
// only from a trusted Envoy (the trust token, or the ext_proc connection's
// verified client certificate); the client's own tenant header counts for
// nothing; a forged, absent, unreadable or tenant-less certificate is 403
// with its own reason, never an untenanted answer.
func TestTenantFromXFCC(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	msgs := chat(longText(40))
	cfg := c.cfg
	sum := sha256.Sum256([]byte("gw-token"))
	cfg.Trust.TokensSHA256 = []string{hex.EncodeToString(sum[:])}
	cfg.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityXFCC,
		XFCC: &globalrouter.XFCCIdentity{SAN: "uri", Prefix: "spiffe://cluster.local/ns/"}}
	r, _ := newRouter(t, cfg)
	p := globalrouter.TenantSaltPrefix
	const tok = "gw-token"
	tests := []struct {
		name   string
		h      map[string]string
		peer   bool
		want   string // the engine's salt
		reason string // the refusal's, when refused
	}{
		{"trusted Envoy", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-a/sa/app"), "x-kvgate-trust": tok}, false, p + "team-a", ""},
		{"mutual TLS Envoy, no token", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-a/sa/app")}, true, p + "team-a", ""},
		{"client's tenant header replaced", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-a/sa/app"), "x-kvgate-trust": tok, "x-tenant": "team-b"}, false, p + "team-a", ""},
		{"appended elements: the last one counts", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-b/sa/x") + "," + xfccOf("spiffe://cluster.local/ns/team-a/sa/app"), "x-kvgate-trust": tok}, false, p + "team-a", ""},
		{"other SANs ignored", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://elsewhere/ns/team-b/sa/app", "spiffe://cluster.local/ns/team-a/sa/app"), "x-kvgate-trust": tok}, false, p + "team-a", ""},
		{"forged: no trusted Envoy", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-a/sa/app")}, false, "", "untrusted_identity"},
		{"forged: wrong token", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-a/sa/app"), "x-kvgate-trust": "guess"}, false, "", "untrusted_identity"},
		{"absent", map[string]string{"x-kvgate-trust": tok}, false, "", "missing_identity"},
		{"absent, tenant header forged", map[string]string{"x-tenant": "team-a"}, false, "", "missing_identity"},
		{"absent, identity mark forged", map[string]string{"x-tenant": "team-a", ":kvgate-identity": "xfcc", "x-kvgate-trust": tok}, false, "", "missing_identity"},
		{"no SAN of the prefix", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://elsewhere/ns/team-a/sa/app"), "x-kvgate-trust": tok}, false, "", "missing_identity"},
		{"two tenants", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-a/sa/app", "spiffe://cluster.local/ns/team-b/sa/app"), "x-kvgate-trust": tok}, false, "", "missing_identity"},
		{"unreadable", map[string]string{"x-forwarded-client-cert": `Subject="CN=x;URI=spiffe://cluster.local/ns/team-a/sa/app`, "x-kvgate-trust": tok}, false, "", "bad_identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...), Headers: tt.h, PeerVerified: tt.peer})
			if tt.reason != "" {
				var ref *globalrouter.Refusal
				if !errors.Is(err, globalrouter.ErrForbidden) || !errors.As(err, &ref) || ref.Reason != tt.reason {
					t.Fatalf("got %v, want 403 %s", err, tt.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			free(t, d)
			if d.CacheSalt != tt.want {
				t.Errorf("Decision.CacheSalt %q, want %q", d.CacheSalt, tt.want)
			}
		})
	}
}

// TestTenantFromXFCCDNS: san dns reads the label before the suffix,
// case-insensitively; a deeper name is no tenant of it.
func TestTenantFromXFCCDNS(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	cfg.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityXFCC,
		XFCC: &globalrouter.XFCCIdentity{SAN: "dns", Suffix: ".tenants.example.com"}}
	r, _ := newRouter(t, cfg)
	for _, tc := range []struct{ dns, want string }{
		{"Team-A.Tenants.Example.com", globalrouter.TenantSaltPrefix + "team-a"},
		{"x.team-a.tenants.example.com", ""},
		{"tenants.example.com", ""},
	} {
		h := map[string]string{"x-forwarded-client-cert": "Hash=ab;DNS=" + tc.dns}
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(longText(40))...), Headers: h, PeerVerified: true})
		if tc.want == "" {
			var ref *globalrouter.Refusal
			if !errors.As(err, &ref) || ref.Reason != "missing_identity" {
				t.Errorf("DNS %s: got %v, want 403 missing_identity", tc.dns, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("DNS %s: %v", tc.dns, err)
		}
		free(t, d)
		if d.CacheSalt != tc.want {
			t.Errorf("DNS %s: salt %q, want %q", tc.dns, d.CacheSalt, tc.want)
		}
	}
}

// jwtMD is the jwt_authn filter's metadata for provider idp's payload.
func jwtMD(t *testing.T, payload map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(map[string]any{"idp": payload})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTenantFromJWTClaim: with tenancy.identity jwt-claim the tenant is
// the claim of the verified payload Envoy's jwt_authn filter left in its
// metadata, believed only from a trusted Envoy; a missing payload or
// claim, or one that is not a string, is 403 missing_identity.
func TestTenantFromJWTClaim(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	cfg.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityJWTClaim,
		JWT: &globalrouter.JWTIdentity{Provider: "idp", Claim: "tenant"}}
	r, _ := newRouter(t, cfg)
	tests := []struct {
		name   string
		md     *structpb.Struct
		peer   bool
		h      map[string]string
		want   string
		reason string
	}{
		{"claim", jwtMD(t, map[string]any{"sub": "u1", "tenant": "team-a"}), true, map[string]string{"x-tenant": "team-b"}, globalrouter.TenantSaltPrefix + "team-a", ""},
		{"untrusted caller", jwtMD(t, map[string]any{"tenant": "team-a"}), false, nil, "", "untrusted_identity"},
		{"no JWT", nil, true, map[string]string{"x-tenant": "team-a"}, "", "missing_identity"},
		{"other provider", func() *structpb.Struct {
			s, _ := structpb.NewStruct(map[string]any{"other": map[string]any{"tenant": "team-a"}})
			return s
		}(), true, nil, "", "missing_identity"},
		{"claim missing", jwtMD(t, map[string]any{"sub": "u1"}), true, nil, "", "missing_identity"},
		{"claim not a string", jwtMD(t, map[string]any{"tenant": 7}), true, nil, "", "missing_identity"},
		{"claim with a NUL", jwtMD(t, map[string]any{"tenant": "team-a\x00x"}), true, nil, "", "missing_identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(longText(40))...), Headers: tt.h, JWTAuthn: tt.md, PeerVerified: tt.peer})
			if tt.reason != "" {
				var ref *globalrouter.Refusal
				if !errors.As(err, &ref) || ref.Reason != tt.reason {
					t.Fatalf("got %v, want 403 %s", err, tt.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			free(t, d)
			if d.CacheSalt != tt.want {
				t.Errorf("Decision.CacheSalt %q, want %q", d.CacheSalt, tt.want)
			}
		})
	}
}

// TestExtraKeyRefusedWhenSalted: SGLang keys its cache by cache_salt and
// extra_key concatenated, so with salting on a request carrying extra_key
// (tenanted or not) is refused 400: tenant "a" with extra_key "b" would
// read tenant "ab"'s cache, and an untenanted extra_key could spell any
// tenant's salt. Without salting extra_key passes.
func TestExtraKeyRefusedWhenSalted(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	cfg.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityOn}
	salted, _ := newRouter(t, cfg)
	open, _ := newRouter(t, c.cfg)
	req := func(h map[string]string) *globalrouter.Request {
		return &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(longText(40))...), Headers: h, ExtraKey: "b"}
	}
	for _, h := range []map[string]string{{"x-tenant": "a"}, nil} {
		if _, err := salted.Decide(ctx, req(h)); !errors.Is(err, globalrouter.ErrBadRequest) || !strings.Contains(err.Error(), "extra_key") {
			t.Errorf("salted, headers %v: got %v, want 400 naming extra_key", h, err)
		}
	}
	d, err := open.Decide(ctx, req(nil))
	if err != nil {
		t.Fatalf("unsalted: %v", err)
	}
	free(t, d)
}
