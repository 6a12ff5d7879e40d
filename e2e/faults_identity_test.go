package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// The identity faults (issue 27 items 1 and 6): a forged, absent or
// unreadable tenant identity through `kvgate up`, for each source
// (tenancy.identity xfcc and jwt-claim).

// xfccOf is the x-forwarded-client-cert Envoy writes (SanitizeSet, URI
// and DNS details) for a client certificate with the given SPIFFE ID.
func xfccOf(spiffe string) string {
	return `By=spiffe://cluster.local/ns/gw/sa/envoy;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="CN=client";URI=` + spiffe + `;DNS=client.example.com`
}

// TestTenantFromXFCCThroughGateway: `kvgate up` with tenancy.identity xfcc
// (the tenant is the namespace of the client certificate's SPIFFE ID, the
// trust token standing for the trusted Envoy that wrote the header): A's
// own second copy reads its cache; B's certificate on A's worker reads 0;
// an XFCC header without the token is 403 untrusted_identity, none at all
// 403 missing_identity, one naming no tenant 403 missing_identity, an
// unreadable one 403 bad_identity; a client's x-tenant counts for nothing.
func TestTenantFromXFCCThroughGateway(t *testing.T) {
	t.Parallel()
	const token = "gateway-secret"
	sum := sha256.Sum256([]byte(token))
	s := startSystem(t, func(c *up.Config) {
		c.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityXFCC,
			XFCC: &globalrouter.XFCCIdentity{SAN: "uri", Prefix: "spiffe://cluster.local/ns/"}}
		c.TrustTokensSHA256 = []string{hex.EncodeToString(sum[:])}
	})
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	c := httpClient(t)
	body := secretBody(0)
	asA := []string{"x-forwarded-client-cert", xfccOf("spiffe://cluster.local/ns/team-a/sa/app"), "x-kvgate-trust", token}
	a := chat(t, ctx, c, s, body, asA...)
	cachedTokens(t, a)
	pin := []string{"x-kvgate-pool", a.pool, "x-kvgate-worker-id", a.worker, "x-kvgate-dp-rank", a.header.Get("x-kvgate-dp-rank")}
	if own := chat(t, ctx, c, s, body, append(asA, pin...)...); cachedTokens(t, own) == 0 {
		t.Fatalf("tenant a's own copy on its worker read 0 cached tokens: the test cannot see a hit")
	}
	asB := []string{"x-forwarded-client-cert", xfccOf("spiffe://cluster.local/ns/team-b/sa/app"), "x-kvgate-trust", token, "x-tenant", "team-a"}
	if b := chat(t, ctx, c, s, body, append(asB, pin...)...); cachedTokens(t, b) != 0 || b.overlap != 0 {
		t.Errorf("tenant b (claiming x-tenant team-a) on a's worker: cached %d, overlap %d; want 0, 0", cachedTokens(t, b), b.overlap)
	}
	for _, tc := range []struct {
		name   string
		hdr    []string
		reason string
	}{
		{"forged: no token", []string{"x-forwarded-client-cert", xfccOf("spiffe://cluster.local/ns/team-a/sa/app")}, "untrusted_identity"},
		{"forged: wrong token", []string{"x-forwarded-client-cert", xfccOf("spiffe://cluster.local/ns/team-a/sa/app"), "x-kvgate-trust", "guess"}, "untrusted_identity"},
		{"absent", []string{"x-kvgate-trust", token, "x-tenant", "team-a"}, "missing_identity"},
		{"no tenant in the certificate", []string{"x-forwarded-client-cert", xfccOf("spiffe://elsewhere/ns/team-a/sa/app"), "x-kvgate-trust", token}, "missing_identity"},
		{"unreadable", []string{"x-forwarded-client-cert", `Subject="CN=x;URI=spiffe://cluster.local/ns/team-a/sa/app`, "x-kvgate-trust", token}, "bad_identity"},
	} {
		r := chat(t, ctx, c, s, body, append(tc.hdr, pin...)...)
		if r.status != 403 || r.header.Get("x-kvgate-dropped-reason") != tc.reason {
			t.Errorf("%s: %d %q %.200s, want 403 %s", tc.name, r.status, r.header.Get("x-kvgate-dropped-reason"), r.body, tc.reason)
		}
	}
	waitIdle(t, s)
}

// TestTenantFromJWTThroughExtproc: `kvgate up` with tenancy.identity
// jwt-claim, driven by the Envoy-faithful client as an Envoy whose
// jwt_authn filter verified a JWT and whose ext_proc filter forwards the
// envoy.filters.http.jwt_authn namespace (an EnvoyExtensionPolicy's
// extProc.metadata.accessibleNamespaces), the trust token standing for the
// trusted Envoy: the claim's tenant reaches the engine as the body's
// cache_salt; metadata without the token is 403 untrusted_identity; no JWT,
// or one without the claim, 403 missing_identity; nothing stays committed.
func TestTenantFromJWTThroughExtproc(t *testing.T) {
	t.Parallel()
	const token = "gateway-secret"
	sum := sha256.Sum256([]byte(token))
	s := startSystem(t, func(c *up.Config) {
		c.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityJWTClaim,
			JWT: &globalrouter.JWTIdentity{Provider: "idp", Claim: "tenant"}}
		c.TrustTokensSHA256 = []string{hex.EncodeToString(sum[:])}
	})
	conn, err := grpc.NewClient(s.ExtprocAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := extprocclient.New(conn, extprocclient.Config{ForwardingNamespaces: []string{globalrouter.JWTAuthnNamespace}, MessageTimeout: 10 * time.Second,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	payload := func(claims map[string]any) map[string]*structpb.Struct {
		st, err := structpb.NewStruct(map[string]any{"idp": claims})
		if err != nil {
			t.Fatal(err)
		}
		return map[string]*structpb.Struct{globalrouter.JWTAuthnNamespace: st}
	}
	headers := func(tok string) extprocclient.Headers {
		h := extprocclient.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
			{Key: ":authority", Value: "kvgate"}, {Key: ":scheme", Value: "http"}, {Key: "content-type", Value: "application/json"},
			{Key: "x-tenant", Value: "team-b"}}
		if tok != "" {
			h = append(h, extprocclient.HeaderField{Key: "x-kvgate-trust", Value: tok})
		}
		return h
	}
	body := []byte(secretBody(0))
	for _, tc := range []struct {
		name   string
		md     map[string]*structpb.Struct
		tok    string
		salt   string
		reason string
	}{
		{"claim", payload(map[string]any{"sub": "u1", "tenant": "team-a"}), token, globalrouter.TenantSaltPrefix + "team-a", ""},
		{"forged: no token", payload(map[string]any{"tenant": "team-a"}), "", "", "untrusted_identity"},
		{"no JWT", nil, token, "", "missing_identity"},
		{"claim missing", payload(map[string]any{"sub": "u1"}), token, "", "missing_identity"},
	} {
		res, err := c.Process(testenv.ContextWithTimeout(t, testTimeout), extprocclient.Request{Metadata: tc.md,
			Message: extprocclient.Message{Headers: headers(tc.tok), Body: [][]byte{body}}})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.reason != "" {
			lr := res.Info.LocalReply
			var reason string
			if lr != nil {
				reason, _ = lr.Headers.Get("x-kvgate-dropped-reason")
			}
			if lr == nil || lr.Status != 403 || reason != tc.reason {
				t.Errorf("%s: local reply %+v, want 403 %s", tc.name, lr, tc.reason)
			}
			continue
		}
		if res.Upstream == nil {
			t.Fatalf("%s: no upstream request (local reply %+v)", tc.name, res.Info.LocalReply)
		}
		var sent struct {
			CacheSalt string `json:"cache_salt"`
		}
		if err := json.Unmarshal(res.Upstream.BodyBytes(), &sent); err != nil || sent.CacheSalt != tc.salt {
			t.Errorf("%s: the engine's cache_salt %q (%v), want %q", tc.name, sent.CacheSalt, err, tc.salt)
		}
	}
	waitIdle(t, s)
}
