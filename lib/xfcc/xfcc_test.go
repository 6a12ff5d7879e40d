package xfcc

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// The examples of Envoy's documentation (headers.rst
// §x-forwarded-client-cert, fb39ca75139560daf6d8f5240abaa3a602a508b0),
// then what Envoy writes with every detail of set_current_client_cert_details
// on (conn_manager_utility.cc: By, Hash, then Cert, Chain and Subject
// quoted, then one URI= and one DNS= pair per SAN).
func TestParseEnvoyExamples(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Element
	}{
		{"one certificate, URI SAN",
			`By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=http://testclient.lyft.com`,
			[]Element{{By: []string{"http://frontend.lyft.com"}, Hash: "468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688", Subject: "/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client", URI: []string{"http://testclient.lyft.com"}}}},
		{"two certificates",
			`By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;URI=http://testclient.lyft.com,By=http://backend.lyft.com;Hash=9ba61d6425303443c0748a02dd8de688468ed33be74eee6556d90c0149c1309e;URI=http://frontend.lyft.com`,
			[]Element{
				{By: []string{"http://frontend.lyft.com"}, Hash: "468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688", URI: []string{"http://testclient.lyft.com"}},
				{By: []string{"http://backend.lyft.com"}, Hash: "9ba61d6425303443c0748a02dd8de688468ed33be74eee6556d90c0149c1309e", URI: []string{"http://frontend.lyft.com"}},
			}},
		{"URI and DNS SANs",
			`By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=http://testclient.lyft.com;DNS=lyft.com;DNS=www.lyft.com`,
			[]Element{{By: []string{"http://frontend.lyft.com"}, Hash: "468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688", Subject: "/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client", URI: []string{"http://testclient.lyft.com"}, DNS: []string{"lyft.com", "www.lyft.com"}}}},
		{"every detail, a SPIFFE ID, keys in any case, an escaped quote",
			`by=spiffe://cluster.local/ns/gw/sa/envoy;HASH=ab;Cert="-----BEGIN%20CERTIFICATE-----%0A";Chain="-----BEGIN%20CERTIFICATE-----%0A";Subject="CN=a \"quoted\",O=b;c";URI=spiffe://cluster.local/ns/team-a/sa/app;uri=spiffe://other;Dns=a.example`,
			[]Element{{By: []string{"spiffe://cluster.local/ns/gw/sa/envoy"}, Hash: "ab", Cert: "-----BEGIN%20CERTIFICATE-----%0A", Chain: "-----BEGIN%20CERTIFICATE-----%0A", Subject: `CN=a "quoted",O=b;c`, URI: []string{"spiffe://cluster.local/ns/team-a/sa/app", "spiffe://other"}, DNS: []string{"a.example"}}}},
		{"an empty Subject and URI (Envoy writes the keys anyway)", `Hash=ab;Subject="";URI=`,
			[]Element{{Hash: "ab", URI: []string{""}}}},
		{"an unknown key is skipped", `Hash=ab;Future="x,y";URI=u`, []Element{{Hash: "ab", URI: []string{"u"}}}},
		{"empty header", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Parse = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"unterminated quote", `Subject="CN=a;URI=x`, "element 0, pair 0: x-forwarded-client-cert: at byte 8: unterminated quoted value"},
		{"text after a quote", `Subject="a"b;URI=x`, "text after the closing quote of Subject"},
		{"no equals", `Hash=ab;URI`, `element 0, pair 1: x-forwarded-client-cert: at byte 11: want key=value, got "URI"`},
		{"empty key", `=x`, "bad key"},
		{"quote in an unquoted value", `URI=a"b`, "a quote inside the unquoted value of URI"},
		{"hash twice", `Hash=a;Hash=b`, `key "Hash" twice in one element`},
		{"empty element", `Hash=a,,Hash=b`, "element 1, pair 0"},
		{"too many elements", strings.Repeat("URI=x,", MaxElements) + "URI=x", "more than 64 elements"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err == nil || !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%q) = %+v, %v; want an ErrSyntax containing %q", tc.in, got, err, tc.want)
			}
		})
	}
}

// format writes elements as Envoy does, quoting every value (allowed:
// a quoted value reads as itself) and escaping quotes.
func format(es []Element) string {
	q := func(v string) string { return `"` + strings.ReplaceAll(v, `"`, `\"`) + `"` }
	var parts []string
	for _, e := range es {
		var kv []string
		for _, b := range e.By {
			kv = append(kv, "By="+q(b))
		}
		for k, v := range map[string]string{"Hash": e.Hash, "Cert": e.Cert, "Chain": e.Chain, "Subject": e.Subject} {
			if v != "" {
				kv = append(kv, k+"="+q(v))
			}
		}
		for _, u := range e.URI {
			kv = append(kv, "URI="+q(u))
		}
		for _, d := range e.DNS {
			kv = append(kv, "DNS="+q(d))
		}
		if len(kv) == 0 {
			kv = []string{"URI=" + q("")}
			e.URI = []string{""}
		}
		parts = append(parts, strings.Join(kv, ";"))
	}
	return strings.Join(parts, ",")
}

// FuzzParse: no input panics; whatever parses, written back with every
// value quoted, parses to the same elements (the quoting is lossless).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`By=http://frontend.lyft.com;Hash=468ed;Subject="/C=US/CN=Test Client";URI=http://testclient.lyft.com;DNS=lyft.com;DNS=www.lyft.com`,
		`Hash=a;URI=spiffe://x/ns/a,Hash=b;URI=spiffe://x/ns/b`,
		`Subject="a \"b\" ; c, d = e"`, `Cert="%0A"`, `URI="`, `x=y=z`, `;;`, `,`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		es, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrSyntax", s, err)
			}
			return
		}
		for _, v := range allValues(es) {
			if strings.HasSuffix(v, `\`) {
				return // a value ending in a backslash cannot be quoted back (\" would read as a quote)
			}
		}
		back := format(es)
		es2, err := Parse(back)
		if err != nil {
			t.Fatalf("Parse(format(Parse(%q))) = %q: %v", s, back, err)
		}
		if !reflect.DeepEqual(normal(es), normal(es2)) {
			t.Fatalf("Parse(%q) = %+v, but its quoted form %q parses to %+v", s, es, back, es2)
		}
	})
}

func allValues(es []Element) []string {
	var vs []string
	for _, e := range es {
		vs = append(vs, e.By...)
		vs = append(vs, e.Hash, e.Cert, e.Chain, e.Subject)
		vs = append(vs, e.URI...)
		vs = append(vs, e.DNS...)
	}
	return vs
}

// normal treats an element with no value at all as format writes it.
func normal(es []Element) []Element {
	out := make([]Element, len(es))
	for i, e := range es {
		if reflect.DeepEqual(e, Element{}) {
			e.URI = []string{""}
		}
		out[i] = e
	}
	return out
}
