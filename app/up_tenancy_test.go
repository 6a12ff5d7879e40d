package app

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/pool"
)

// digest is a trust token's SHA-256 (of "gw-token").
const digest = "46ce721ddea7bcd13a0ddf1ea5442788c582635fcc47993c7ce653777c78ba7f"

// TestUpTenancyFlags: `kvgate up`'s tenancy flags, through the parse path
// Run takes, give the tenancy section the configuration file's fields of
// the same names give (and that the global router validates), and every
// inconsistent combination is refused with an error naming the flag.
func TestUpTenancyFlags(t *testing.T) {
	const tok = "-trust-token-sha256=" + digest
	tests := []struct {
		name string
		args []string
		want globalrouter.TenancyConfig
		err  string // a fragment of the refusal, when refused
	}{
		{"off", nil, globalrouter.TenancyConfig{}, ""},
		{"trusted header (the default)", []string{"-tenant-header=x-tenant", tok}, globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityTrusted}, ""},
		{"on needs no token", []string{"-tenant-header=x-tenant", "-tenancy-identity=on"}, globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityOn}, ""},
		{"xfcc by a URI prefix", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=xfcc", "-tenancy-xfcc-prefix=spiffe://cluster.local/ns/"},
			globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityXFCC, XFCC: &globalrouter.XFCCIdentity{SAN: "uri", Prefix: "spiffe://cluster.local/ns/"}}, ""},
		{"xfcc by a DNS suffix, san given", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=xfcc", "-tenancy-xfcc-san=dns", "-tenancy-xfcc-suffix=.tenants.example.com"},
			globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityXFCC, XFCC: &globalrouter.XFCCIdentity{SAN: "dns", Suffix: ".tenants.example.com"}}, ""},
		{"jwt-claim", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=jwt-claim", "-tenancy-jwt-provider=idp", "-tenancy-jwt-claim=tenant"},
			globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityJWTClaim, JWT: &globalrouter.JWTIdentity{Provider: "idp", Claim: "tenant"}}, ""},

		{"identity without a header", []string{"-tenancy-identity=xfcc"}, globalrouter.TenancyConfig{}, "-tenancy-identity needs -tenant-header"},
		{"a claim without a header", []string{"-tenancy-jwt-claim=tenant"}, globalrouter.TenancyConfig{}, "-tenancy-jwt-claim needs -tenant-header"},
		{"unknown identity", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=mtls"}, globalrouter.TenancyConfig{}, `-tenancy-identity "mtls": want trusted, on, xfcc or jwt-claim`},
		{"trusted without a token", []string{"-tenant-header=x-tenant"}, globalrouter.TenancyConfig{}, "-tenancy-identity trusted needs -trust-token-sha256"},
		{"xfcc without a token", []string{"-tenant-header=x-tenant", "-tenancy-identity=xfcc", "-tenancy-xfcc-prefix=spiffe://x/"}, globalrouter.TenancyConfig{}, "-tenancy-identity xfcc needs -trust-token-sha256"},
		{"xfcc flag under jwt-claim", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=jwt-claim", "-tenancy-jwt-provider=idp", "-tenancy-jwt-claim=tenant", "-tenancy-xfcc-prefix=spiffe://x/"},
			globalrouter.TenancyConfig{}, "-tenancy-xfcc-prefix is read only with -tenancy-identity xfcc (it is jwt-claim)"},
		{"jwt flag under the default", []string{"-tenant-header=x-tenant", tok, "-tenancy-jwt-claim=tenant"}, globalrouter.TenancyConfig{}, "-tenancy-jwt-claim is read only with -tenancy-identity jwt-claim (it is trusted)"},
		{"xfcc without a SAN rule", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=xfcc"}, globalrouter.TenancyConfig{}, "-tenancy-identity xfcc needs -tenancy-xfcc-prefix"},
		{"xfcc with both rules", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=xfcc", "-tenancy-xfcc-prefix=spiffe://x/", "-tenancy-xfcc-suffix=.x"}, globalrouter.TenancyConfig{}, "-tenancy-xfcc-prefix and -tenancy-xfcc-suffix: give one"},
		{"san uri with a suffix", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=xfcc", "-tenancy-xfcc-san=uri", "-tenancy-xfcc-suffix=.x"}, globalrouter.TenancyConfig{}, "-tenancy-xfcc-san uri needs -tenancy-xfcc-prefix"},
		{"unknown san", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=xfcc", "-tenancy-xfcc-san=email", "-tenancy-xfcc-prefix=spiffe://x/"}, globalrouter.TenancyConfig{}, `-tenancy-xfcc-san "email": want uri or dns`},
		{"suffix without a dot", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=xfcc", "-tenancy-xfcc-suffix=tenants.example.com"}, globalrouter.TenancyConfig{}, `-tenancy-xfcc-suffix "tenants.example.com": begin it with a dot`},
		{"jwt-claim without a claim", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=jwt-claim", "-tenancy-jwt-provider=idp"}, globalrouter.TenancyConfig{}, "-tenancy-identity jwt-claim needs -tenancy-jwt-claim"},
		{"jwt-claim without a provider", []string{"-tenant-header=x-tenant", tok, "-tenancy-identity=jwt-claim", "-tenancy-jwt-claim=tenant"}, globalrouter.TenancyConfig{}, "-tenancy-identity jwt-claim needs -tenancy-jwt-provider"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, err := parseUp(tt.args, nil)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, cfg.Tenancy); diff != "" {
				t.Errorf("tenancy (-want +got):\n%s", diff)
			}
			// What the flags make, the global router takes as it is.
			gcfg := globalrouter.DefaultConfig(pool.NewConfig("p", 16, []string{"m"}, "127.0.0.1:1"))
			gcfg.Tenancy, gcfg.Trust.TokensSHA256 = cfg.Tenancy, cfg.TrustTokensSHA256
			if err := gcfg.Validate(nil); err != nil {
				t.Errorf("the global router refuses the flags' tenancy: %v", err)
			}
		})
	}
}
