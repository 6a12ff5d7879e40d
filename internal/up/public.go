package up

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// PublicPaths are the paths the gateway forwards besides the ext_proc
// server's inference paths: the model list and the health check (and
// ModelPathPrefix + one model id, modelPath). Anything
// else (a worker's /reset_prefix_cache, /metrics, /tokenize) is answered
// 404 by the gateway itself and never reaches a worker.
var PublicPaths = []string{"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}

// publicOnly serves next for PublicPaths and inference, and a 404 in the
// OpenAI error shape for anything else (Anthropic's to a request with
// anthropic-version or under /v1/messages/). The match is on the exact path: a
// percent-encoded path (RawPath set) or one with dot segments is refused,
// so no spelling of a path reaches a worker as another one.
func publicOnly(next http.Handler, inference []string) http.Handler {
	allowed := map[string]bool{}
	for _, p := range append(append([]string(nil), PublicPaths...), inference...) {
		allowed[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.URL.RawPath == "" && allowed[r.URL.Path]) || modelPath(r.URL) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		msg := "no route for " + r.Method + " " + r.URL.Path
		if r.Header.Get("anthropic-version") != "" || strings.HasPrefix(r.URL.Path, "/v1/messages/") {
			// An Anthropic client (its SDK sends anthropic-version on every
			// request) reads Anthropic's error shape.
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "request_id": nil,
				"error": map[string]any{"type": "not_found_error", "message": msg}})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
			"message": msg,
			"type":    "not_found_error",
			"code":    "not_found",
		}})
	})
}

// ModelPathPrefix is the path of one model's entry (GET /v1/models/{id},
// OpenAI's models.retrieve and Anthropic's).
const ModelPathPrefix = "/v1/models/"

// modelPath reports whether u is ModelPathPrefix and one path segment,
// a model id, not "." or "..": an id with a slash comes percent-encoded
// (the SDKs encode path parameters), so the segment is read escaped and
// may decode to anything but a dot segment.
func modelPath(u *url.URL) bool {
	esc, ok := strings.CutPrefix(u.EscapedPath(), ModelPathPrefix)
	if !ok || esc == "" || strings.Contains(esc, "/") {
		return false
	}
	id, err := url.PathUnescape(esc)
	return err == nil && id != "." && id != ".."
}
