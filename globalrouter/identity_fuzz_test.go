package globalrouter

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzXFCCTenant: whatever x-forwarded-client-cert a trusted caller sends,
// reading the tenant never panics; it is a tenant or a refusal; a uri
// tenant is one non-empty path segment and a dns tenant one non-empty
// label, both found in the header.
func FuzzXFCCTenant(f *testing.F) {
	for _, s := range []string{
		`By=spiffe://cluster.local/ns/gw/sa/envoy;Hash=ab;Subject="CN=x";URI=spiffe://cluster.local/ns/team-a/sa/app;DNS=team-a.tenants.example.com`,
		`URI=spiffe://cluster.local/ns/a,URI=spiffe://cluster.local/ns/b/x`,
		`URI="spiffe://cluster.local/ns/q\"uote/sa"`, `DNS=.tenants.example.com`, `URI=spiffe://cluster.local/ns/`, `Subject="`, ``,
	} {
		f.Add(s)
	}
	uri := &XFCCIdentity{SAN: "uri", Prefix: "spiffe://cluster.local/ns/"}
	dns := &XFCCIdentity{SAN: "dns", Suffix: ".tenants.example.com"}
	f.Fuzz(func(t *testing.T, v string) {
		for _, x := range []*XFCCIdentity{uri, dns} {
			tenant, err := x.tenant(v, true)
			if err != nil {
				var ref *Refusal
				if !errors.As(err, &ref) || !errors.Is(err, ErrForbidden) {
					t.Fatalf("%s %q: error %v is not a 403 refusal", x.SAN, v, err)
				}
				continue
			}
			sep := "/"
			if x.SAN == "dns" {
				sep = "."
			}
			if tenant == "" || strings.Contains(tenant, sep) {
				t.Fatalf("%s %q: tenant %q", x.SAN, v, tenant)
			}
			plain := strings.ReplaceAll(v, `\"`, `"`) // a quoted value's escapes
			if utf8.ValidString(v) && !strings.Contains(strings.ToLower(plain), tenant) && !strings.Contains(plain, tenant) {
				t.Fatalf("%s %q: tenant %q is not in the header", x.SAN, v, tenant)
			}
		}
		if _, err := uri.tenant(v, false); v != "" && err == nil {
			t.Fatalf("%q from an untrusted caller: believed", v)
		}
	})
}
