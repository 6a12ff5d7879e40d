package globalrouter_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
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

// jwtMD is the jwt_authn filter's metadata: provider → payload.
func jwtMD(t *testing.T, providers map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(providers)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// idp is the metadata of provider idp's payload.
func idp(t *testing.T, payload map[string]any) *structpb.Struct {
	return jwtMD(t, map[string]any{"idp": payload})
}

// TestTenantFromEnvoyIdentity: under tenancy.identity xfcc the tenant is a
// SAN of the client certificate Envoy forwards (uri: the SPIFFE ID's
// segment after the prefix; dns: the label before the suffix,
// case-insensitively), under jwt-claim a claim of the payload Envoy's
// jwt_authn filter verified; both believed only from a trusted Envoy (the
// trust token, or the ext_proc connection's verified client certificate).
// The client's own tenant header counts for nothing; a forged, absent,
// unreadable or tenant-less identity is 403 with its own reason, never an
// untenanted answer.
func TestTenantFromEnvoyIdentity(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	sum := sha256.Sum256([]byte("gw-token"))
	routers := map[string]*globalrouter.Router{}
	for name, ten := range map[string]globalrouter.TenancyConfig{
		"uri": {Identity: globalrouter.IdentityXFCC, XFCC: &globalrouter.XFCCIdentity{SAN: "uri", Prefix: "spiffe://cluster.local/ns/"}},
		"dns": {Identity: globalrouter.IdentityXFCC, XFCC: &globalrouter.XFCCIdentity{SAN: "dns", Suffix: ".tenants.example.com"}},
		"jwt": {Identity: globalrouter.IdentityJWTClaim, JWT: &globalrouter.JWTIdentity{Provider: "idp", Claim: "tenant"}},
	} {
		cfg := c.cfg
		cfg.Trust.TokensSHA256 = []string{hex.EncodeToString(sum[:])}
		ten.Header, ten.Salt = "x-tenant", true
		cfg.Tenancy = ten
		routers[name], _ = newRouter(t, cfg)
	}
	p := globalrouter.TenantSaltPrefix
	const tok = "gw-token"
	cert := func(uris ...string) map[string]string {
		return map[string]string{"x-forwarded-client-cert": xfccOf(uris...), "x-kvgate-trust": tok}
	}
	dns := func(name string) map[string]string {
		return map[string]string{"x-forwarded-client-cert": "Hash=ab;DNS=" + name}
	}
	teamA := "spiffe://cluster.local/ns/team-a/sa/app"
	tests := []struct {
		name, by string // by: the router (uri, dns, jwt)
		h        map[string]string
		md       *structpb.Struct
		peer     bool
		want     string // the engine's salt
		reason   string // the refusal's, when refused
	}{
		{"trusted Envoy", "uri", cert(teamA), nil, false, p + "team-a", ""},
		{"mutual TLS Envoy, no token", "uri", map[string]string{"x-forwarded-client-cert": xfccOf(teamA)}, nil, true, p + "team-a", ""},
		{"client's tenant header replaced", "uri", with(cert(teamA), "x-tenant", "team-b"), nil, false, p + "team-a", ""},
		{"appended elements: the last one counts", "uri", map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-b/sa/x") + "," + xfccOf(teamA), "x-kvgate-trust": tok}, nil, false, p + "team-a", ""},
		{"other SANs ignored", "uri", cert("spiffe://elsewhere/ns/team-b/sa/app", teamA), nil, false, p + "team-a", ""},
		{"forged: no trusted Envoy", "uri", map[string]string{"x-forwarded-client-cert": xfccOf(teamA)}, nil, false, "", "untrusted_identity"},
		{"forged: wrong token", "uri", with(cert(teamA), "x-kvgate-trust", "guess"), nil, false, "", "untrusted_identity"},
		{"absent", "uri", map[string]string{"x-kvgate-trust": tok}, nil, false, "", "missing_identity"},
		{"absent, tenant header forged", "uri", map[string]string{"x-tenant": "team-a"}, nil, false, "", "missing_identity"},
		{"absent, tenant header from a trusted caller", "uri", map[string]string{"x-tenant": "team-a", "x-kvgate-trust": tok}, nil, false, "", "missing_identity"},
		{"no SAN of the prefix", "uri", cert("spiffe://elsewhere/ns/team-a/sa/app"), nil, false, "", "missing_identity"},
		{"two tenants", "uri", cert(teamA, "spiffe://cluster.local/ns/team-b/sa/app"), nil, false, "", "missing_identity"},
		{"unreadable", "uri", map[string]string{"x-forwarded-client-cert": `Subject="CN=x;URI=` + teamA, "x-kvgate-trust": tok}, nil, false, "", "bad_identity"},
		{"DNS label, lower-cased", "dns", dns("Team-A.Tenants.Example.com"), nil, true, p + "team-a", ""},
		{"DNS: a deeper name is no tenant", "dns", dns("x.team-a.tenants.example.com"), nil, true, "", "missing_identity"},
		{"DNS: the suffix alone", "dns", dns("tenants.example.com"), nil, true, "", "missing_identity"},
		{"JWT claim", "jwt", map[string]string{"x-tenant": "team-b"}, idp(t, map[string]any{"sub": "u1", "tenant": "team-a"}), true, p + "team-a", ""},
		{"JWT: untrusted caller", "jwt", nil, idp(t, map[string]any{"tenant": "team-a"}), false, "", "untrusted_identity"},
		{"JWT: none", "jwt", map[string]string{"x-tenant": "team-a"}, nil, true, "", "missing_identity"},
		{"JWT: other provider", "jwt", nil, jwtMD(t, map[string]any{"other": map[string]any{"tenant": "team-a"}}), true, "", "missing_identity"},
		{"JWT: claim missing", "jwt", nil, idp(t, map[string]any{"sub": "u1"}), true, "", "missing_identity"},
		{"JWT: claim not a string", "jwt", nil, idp(t, map[string]any{"tenant": 7}), true, "", "missing_identity"},
		{"JWT: claim with a NUL", "jwt", nil, idp(t, map[string]any{"tenant": "team-a\x00x"}), true, "", "missing_identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat(longText(40))...), Headers: tt.h, JWTAuthn: tt.md, PeerVerified: tt.peer}
			d, err := routers[tt.by].Decide(ctx, req)
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

// with is h and the pairs kv, in a new map.
func with(h map[string]string, kv ...string) map[string]string {
	out := maps.Clone(h)
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// hookTokenizer runs hook once, on the first Encode: a seam inside a
// decision, after it took its configuration snapshot.
type hookTokenizer struct {
	globalrouter.Tokenizer
	once sync.Once
	hook func()
}

func (h *hookTokenizer) Encode(s string) ([]uint32, error) {
	if h.hook != nil {
		h.once.Do(h.hook)
	}
	return h.Tokenizer.Encode(s)
}

// TestIdentityOneSnapshot: a decision derives its tenant from the one
// configuration snapshot it holds, and salts and runs the policies with
// that same snapshot: a reload that switches the identity source in the
// middle of a decision (xfcc, tenant team-a, to jwt-claim, tenant team-b,
// on a request that carries both) changes nothing of that decision, and
// the next decision reads only the new configuration. header-match sees
// the derived tenant under the tenant header (the client's own copy
// replaced), so each tenant lands in its own pool.
func TestIdentityOneSnapshot(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	cfg.Pools = slices.Clone(c.cfg.Pools)
	cfg.Chain = []policies.Spec{{Name: "model-match"}, {Name: "header-match"}, {Name: "cost"}}
	cfg.Pools[0].Policy = policies.PoolSection{"header-match": section(policies.HeaderMatchPool{Headers: map[string][]string{"x-tenant": {"team-b"}}})}
	cfg.Pools[1].Policy = policies.PoolSection{"header-match": section(policies.HeaderMatchPool{Headers: map[string][]string{"x-tenant": {"team-a"}}})}
	byCert := cfg
	byCert.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityXFCC,
		XFCC: &globalrouter.XFCCIdentity{SAN: "uri", Prefix: "spiffe://cluster.local/ns/"}}
	byJWT := cfg
	byJWT.Trust.Header = "x-other-trust" // marks the new snapshot: TrustHeader reads it
	byJWT.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityJWTClaim,
		JWT: &globalrouter.JWTIdentity{Provider: "idp", Claim: "tenant"}}

	tk := &hookTokenizer{Tokenizer: sharedTokenizer(t)}
	r, _ := newRouter(t, byCert, globalrouter.WithTokenizer(model, tk))
	reloaded := make(chan error, 1)
	tk.hook = func() {
		// Reload waits for the old snapshot's last holder (this decision)
		// before it returns; it is in force once TrustHeader reads it.
		go func() { reloaded <- r.Reload(byJWT) }()
		for r.TrustHeader() != "x-other-trust" {
			select {
			case err := <-reloaded:
				t.Errorf("Reload: %v", err)
				return
			case <-ctx.Done():
				t.Error("the reload never took effect")
				return
			default:
				runtime.Gosched()
			}
		}
	}
	req := &globalrouter.Request{Model: model, Prompt: longText(40), PeerVerified: true,
		Headers:  map[string]string{"x-forwarded-client-cert": xfccOf("spiffe://cluster.local/ns/team-a/sa/app"), "x-tenant": "team-b"},
		JWTAuthn: idp(t, map[string]any{"tenant": "team-b"})}
	for i, want := range []struct{ salt, pool string }{
		{globalrouter.TenantSaltPrefix + "team-a", "pool-b"}, // reloaded during it
		{globalrouter.TenantSaltPrefix + "team-b", "pool-a"},
	} {
		d, err := r.Decide(ctx, req)
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		free(t, d)
		if d.CacheSalt != want.salt || d.Primary.Pool != want.pool {
			t.Errorf("decision %d: salt %q in %s, want %q in %s", i, d.CacheSalt, d.Primary.Pool, want.salt, want.pool)
		}
		if i == 0 {
			if err := <-reloaded; err != nil {
				t.Fatalf("Reload: %v", err)
			}
		}
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
