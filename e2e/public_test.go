package e2e

import (
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
)

// TestPublicSurface: the gateway forwards only the OpenAI paths and
// /health; a worker's admin paths, the status page and anything else get
// the gateway's own 404 and never reach a worker (issue 13 item 9/10: any
// client could POST /reset_prefix_cache and read status.json with every
// internal address).
func TestPublicSurface(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	c := httpClient(t)
	do := func(method, base, path, body string) (int, string) {
		t.Helper()
		resp := send(t, ctx, c, method, base+path, body)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// A cache to reset: one request leaves blocks on a worker.
	if r := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt("public", 0), false, 2)); r.status != 200 {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	cached := func() int {
		n := 0
		for _, p := range s.Pools {
			for _, w := range p.Workers {
				n += w.Stats().CachedBlocks
			}
		}
		return n
	}
	before := cached()
	if before == 0 {
		t.Fatal("no worker caches a block after a request")
	}
	for _, tt := range []struct{ method, path string }{
		{"POST", "/reset_prefix_cache"},
		{"GET", "/metrics"},
		{"POST", "/tokenize"},
		{"GET", "/kvgate/"},
		{"GET", "/kvgate/status.json"},
		{"GET", "/kvgate/metrics"},
		{"POST", "/v1/completions/../../reset_prefix_cache"},
		{"POST", "/v1/completions%2F..%2F..%2Freset_prefix_cache"},
		{"POST", "//reset_prefix_cache"},
		{"GET", "/v1/models/mock-llama/../../../reset_prefix_cache"},
		{"GET", "/v1/models/%2E%2E"},
	} {
		code, body := do(tt.method, s.GatewayURL(), tt.path, `{"prompt":"hi"}`)
		var e struct {
			Error struct{ Type string } `json:"error"`
		}
		if code != 404 || json.Unmarshal([]byte(body), &e) != nil || e.Error.Type != "not_found_error" {
			t.Errorf("%s %s through the gateway: got %d %s, want the gateway's 404", tt.method, tt.path, code, body)
		}
		for _, p := range s.Pools {
			for _, w := range p.Workers {
				if strings.Contains(body, w.Addr) {
					t.Errorf("%s %s: body names worker address %s", tt.method, tt.path, w.Addr)
				}
			}
		}
	}
	if got := cached(); got != before {
		t.Errorf("cached blocks %d after the refused resets, want %d (a reset got through)", got, before)
	}
	for _, path := range []string{"/v1/models", "/v1/models/mock-llama", "/health"} {
		if code, body := do("GET", s.GatewayURL(), path, ""); code != 200 {
			t.Errorf("GET %s: got %d %s, want 200", path, code, body)
		}
	}
	// The admin listener is loopback and serves the status.
	host, _, _ := net.SplitHostPort(strings.TrimPrefix(s.AdminURL(), "http://"))
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Errorf("admin address %s is not loopback", s.AdminURL())
	}
	if code, _ := do("GET", s.AdminURL(), "/kvgate/status.json", ""); code != 200 {
		t.Errorf("admin status.json: %d", code)
	}
}
