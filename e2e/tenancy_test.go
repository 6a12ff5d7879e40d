package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// TestTenantIsolationThroughGateway (issue 27 item 1): with tenancy on
// (`kvgate up -tenant-header x-tenant -trust-token-sha256 …`), tenant B's
// exact copy of tenant A's long prompt gets 0 overlap from the router and
// 0 cached tokens from the engine, even pinned to the worker that caches
// A's copy: the routed body carries each tenant's salt as cache_salt and
// the mock engine salts its blocks as vLLM does. A client's own cache_salt
// is combined with the tenant's, not a way into it; an untenanted copy
// reads nothing either. A client that names tenant A without the
// gateway's trust token is refused (403), so forging the header gains
// nothing.
func TestTenantIsolationThroughGateway(t *testing.T) {
	const token = "gateway-secret"
	sum := sha256.Sum256([]byte(token))
	s := startSystem(t, fixedProbes, func(c *up.Config) {
		c.Tenancy.Header, c.Tenancy.Salt = "x-tenant", true
		c.TrustTokensSHA256 = []string{hex.EncodeToString(sum[:])}
	})
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	c := httpClient(t)
	body := chatBody("mock-llama", longPrompt("confidential", 0), false, 2)
	withSalt := func(salt string) string {
		var m map[string]any
		_ = json.Unmarshal([]byte(body), &m)
		m["cache_salt"] = salt
		b, _ := json.Marshal(m)
		return string(b)
	}
	a := chat(t, ctx, c, s, body, "x-tenant", "a", "x-kvgate-trust", token)
	cachedTokens(t, a)
	waitCached(t, s, a.pool, a.worker, 20)
	pin := []string{"x-kvgate-pool", a.pool, "x-kvgate-worker-id", a.worker, "x-kvgate-dp-rank", a.header.Get("x-kvgate-dp-rank")}
	// Control: A's second copy is routed to its cache and read from it.
	again := chat(t, ctx, c, s, body, "x-tenant", "a", "x-kvgate-trust", token)
	if again.overlap < 20 || cachedTokens(t, again) < 20*16 {
		t.Fatalf("tenant a's own copy: overlap %d, cached %d; want its prefix cached (the test shows nothing)", again.overlap, cachedTokens(t, again))
	}

	for _, tc := range []struct {
		name string
		body string
		hdr  []string
	}{
		{"tenant b", body, []string{"x-tenant", "b", "x-kvgate-trust", token}},
		{"tenant b pinned to a's worker", body, append([]string{"x-tenant", "b2", "x-kvgate-trust", token}, pin...)},
		{"tenant a with its own cache_salt, pinned", withSalt("x"), append([]string{"x-tenant", "a", "x-kvgate-trust", token}, pin...)},
		{"untenanted, pinned", body, pin},
	} {
		r := chat(t, ctx, c, s, tc.body, tc.hdr...)
		if n := cachedTokens(t, r); n != 0 || r.overlap != 0 {
			t.Errorf("%s: engine cached %d tokens, router overlap %d blocks; want 0 and 0", tc.name, n, r.overlap)
		}
	}
	for _, forged := range [][]string{{"x-tenant", "a"}, {"x-tenant", "a", "x-kvgate-trust", "guess"}} {
		r := chat(t, ctx, c, s, body, forged...)
		if r.status != 403 || r.header.Get("x-kvgate-dropped-reason") != "untrusted_header" {
			t.Errorf("forged %v: %d %q %.200s, want 403 untrusted_header", forged, r.status, r.header.Get("x-kvgate-dropped-reason"), r.body)
		}
	}
	waitIdle(t, s)
}
