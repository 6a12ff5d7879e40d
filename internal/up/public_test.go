package up

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestPublicOnlyModelPath: GET /v1/models/{id} reaches the gateway for one
// id segment (percent-encoded as the SDKs send an id with a slash), never
// a dot segment or a deeper path.
func TestPublicOnlyModelPath(t *testing.T) {
	h := publicOnly(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }), []string{"/v1/responses", "/v1/messages"})
	for _, tc := range []struct {
		target string
		pass   bool
	}{
		{"/v1/models/mock-llama", true},
		{"/v1/models/Qwen%2FQwen3-0.6B", true},
		{"/v1/responses", true},
		{"/v1/messages", true},
		{"/v1/models/", false},
		{"/v1/models/a/b", false},
		{"/v1/models/..", false},
		{"/v1/models/%2E%2E", false},
		{"/v1/models/%2e", false},
		{"/v1/models/a/../../reset_prefix_cache", false},
		{"/v1/modelsx", false},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "http://gw"+tc.target, nil))
		if got := rec.Code == http.StatusTeapot; got != tc.pass {
			t.Errorf("GET %s: forwarded %v, want %v (status %d)", tc.target, got, tc.pass, rec.Code)
		}
	}
}

// TestPublicOnlyAnthropic404: the gateway's own 404 is in Anthropic's
// shape for an Anthropic client.
func TestPublicOnlyAnthropic404(t *testing.T) {
	h := publicOnly(http.NotFoundHandler(), nil)
	for _, tc := range []struct {
		path, version string
		anthropic     bool
	}{
		{"/v1/messages/count_tokens", "", true},
		{"/v1/files", "2023-06-01", true},
		{"/v1/files", "", false},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "http://gw"+tc.path, nil)
		if tc.version != "" {
			req.Header.Set("anthropic-version", tc.version)
		}
		h.ServeHTTP(rec, req)
		var e struct {
			Type  string
			Error struct{ Type, Code string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != 404 || e.Error.Type != "not_found_error" ||
			(e.Type == "error") != tc.anthropic || (e.Error.Code == "not_found") == tc.anthropic {
			t.Errorf("POST %s (anthropic-version %q): %d %s, want Anthropic's shape %v", tc.path, tc.version, rec.Code, rec.Body, tc.anthropic)
		}
	}
}

// FuzzModelPath: any path is either refused or one non-dot segment under
// /v1/models/.
func FuzzModelPath(f *testing.F) {
	for _, s := range []string{"/v1/models/x", "/v1/models/%2F", "/v1/models/%zz", "/v1/models/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		u, err := url.Parse(p)
		if err != nil || !modelPath(u) {
			return
		}
		rest := strings.TrimPrefix(u.EscapedPath(), ModelPathPrefix)
		id, err := url.PathUnescape(rest)
		if rest == "" || strings.Contains(rest, "/") || err != nil || id == "." || id == ".." {
			t.Errorf("modelPath(%q) accepted %q", p, rest)
		}
	})
}
