package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// cachedTokens reads usage.prompt_tokens_details.cached_tokens of a 200.
func cachedTokens(t *testing.T, r reply) int {
	t.Helper()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if r.status != 200 {
		t.Fatalf("status %d: %.300s", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatalf("%v: %.300s", err, r.body)
	}
	return out.Usage.Details.Cached
}

// secretBody is a chat of about ten blocks that shares no block with
// another try's: the try's number comes first in the system message, so
// even the first block (the template's header and the system message's
// start) differs, and a tenant's earlier tries cannot be what it hits.
func secretBody(try int) string {
	var b strings.Builder
	for i := range 8 {
		fmt.Fprintf(&b, "Clause %d of contract %d binds the parties to terms %d. ", i, try, try*8+i)
	}
	out, _ := json.Marshal(map[string]any{
		"model": "mock-llama", "max_tokens": 1,
		"messages": []map[string]string{{"role": "system", "content": fmt.Sprintf("%d: case %d, terse.", try, try)}, {"role": "user", "content": b.String()}},
	})
	return string(out)
}

// TestCrossTenantTries is issue 27's target "cross-tenant cached tokens 0
// in 100 of 100 tries" through `kvgate up`: each try, tenant A sends a
// fresh prompt, then tenant B sends A's exact copy pinned to the worker
// that cached it (the strongest position: the same engine cache), and a
// forger sends it too, in turn: naming tenant a without the trust token,
// with a wrong one, and untenanted pinned to A's worker. B's and the
// untenanted copies must read 0 cached tokens from the engine and 0
// overlap from the router; the forged tenant headers are 403. Every tenth
// try A's own second copy is the control: the engine does hit A's cache.
func TestCrossTenantTries(t *testing.T) {
	const token, tries = "gateway-secret", 100
	sum := sha256.Sum256([]byte(token))
	s := startSystem(t, fixedProbes, func(c *up.Config) {
		c.Tenancy.Header, c.Tenancy.Salt = "x-tenant", true
		c.TrustTokensSHA256 = []string{hex.EncodeToString(sum[:])}
	})
	ctx := testenv.ContextWithTimeout(t, 4*testTimeout)
	c := httpClient(t)
	var hits, bCached, bOverlap, forgedServed, untenantedCached, controls, controlHits, controlOverlap int
	for try := range tries {
		body := secretBody(try)
		a := chat(t, ctx, c, s, body, "x-tenant", "a", "x-kvgate-trust", token)
		cachedTokens(t, a)
		pin := []string{"x-kvgate-pool", a.pool, "x-kvgate-worker-id", a.worker, "x-kvgate-dp-rank", a.header.Get("x-kvgate-dp-rank")}
		b := chat(t, ctx, c, s, body, append([]string{"x-tenant", "b", "x-kvgate-trust", token}, pin...)...)
		if n := cachedTokens(t, b); n != 0 || b.overlap != 0 {
			hits++
			bCached += n
			bOverlap += b.overlap
			t.Errorf("try %d: tenant b's copy of a's prompt on a's worker %s read %d cached tokens, overlap %d", try, a.worker, n, b.overlap)
		}
		switch try % 3 {
		case 0, 1:
			forged := []string{"x-tenant", "a"}
			if try%3 == 1 {
				forged = append(forged, "x-kvgate-trust", "guess")
			}
			r := chat(t, ctx, c, s, body, append(forged, pin...)...)
			if r.status != 403 || r.header.Get("x-kvgate-dropped-reason") != "untrusted_header" {
				forgedServed++
				t.Errorf("try %d: forged %v: %d %q, want 403 untrusted_header", try, forged, r.status, r.header.Get("x-kvgate-dropped-reason"))
			}
		case 2:
			r := chat(t, ctx, c, s, body, pin...)
			if n := cachedTokens(t, r); n != 0 || r.overlap != 0 {
				untenantedCached++
				t.Errorf("try %d: an untenanted copy on a's worker read %d cached tokens, overlap %d", try, n, r.overlap)
			}
		}
		if try%10 == 9 {
			controls++
			own := chat(t, ctx, c, s, body, append([]string{"x-tenant", "a", "x-kvgate-trust", token}, pin...)...)
			if cachedTokens(t, own) > 0 {
				controlHits++
			}
			controlOverlap += own.overlap
		}
	}
	t.Logf("cross-tenant: %d of %d tries read cached tokens (%d tokens, %d overlap blocks); forged tenant headers served %d; untenanted copies cached %d; control: tenant a's own copy hit %d of %d (router overlap %d blocks in all)",
		hits, tries, bCached, bOverlap, forgedServed, untenantedCached, controlHits, controls, controlOverlap)
	if controlHits != controls {
		t.Errorf("control: tenant a's own copy hit its cache in %d of %d checks; the test cannot see a hit", controlHits, controls)
	}
	waitIdle(t, s)
}

// TestCrossTenantTriesUnsalted is the counter's own control: the same
// tries against `kvgate up` without tenancy read A's cache every time, so
// TestCrossTenantTries's 0 is the salting's, not a blind counter's.
func TestCrossTenantTriesUnsalted(t *testing.T) {
	s := startSystem(t, fixedProbes)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	c := httpClient(t)
	const tries = 5
	hits := 0
	for try := range tries {
		body := secretBody(try)
		a := chat(t, ctx, c, s, body, "x-tenant", "a")
		cachedTokens(t, a)
		b := chat(t, ctx, c, s, body, "x-tenant", "b", "x-kvgate-pool", a.pool, "x-kvgate-worker-id", a.worker, "x-kvgate-dp-rank", a.header.Get("x-kvgate-dp-rank"))
		if cachedTokens(t, b) > 0 {
			hits++
		}
	}
	if hits != tries {
		t.Errorf("without tenancy, tenant b's copy read a's cache in %d of %d tries; want every one", hits, tries)
	}
	waitIdle(t, s)
}
