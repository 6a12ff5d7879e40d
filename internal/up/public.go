package up

import (
	"encoding/json"
	"net/http"
)

// PublicPaths are the paths the gateway forwards besides the ext_proc
// server's inference paths: the model list and the health check. Anything
// else (a worker's /reset_prefix_cache, /metrics, /tokenize) is answered
// 404 by the gateway itself and never reaches a worker.
var PublicPaths = []string{"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}

// publicOnly serves next for PublicPaths and inference, and a 404 in the
// OpenAI error shape for anything else. The match is on the exact path: a
// percent-encoded path (RawPath set) or one with dot segments is refused,
// so no spelling of a path reaches a worker as another one.
func publicOnly(next http.Handler, inference []string) http.Handler {
	allowed := map[string]bool{}
	for _, p := range append(append([]string(nil), PublicPaths...), inference...) {
		allowed[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawPath == "" && allowed[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
			"message": "no route for " + r.Method + " " + r.URL.Path,
			"type":    "not_found_error",
			"code":    "not_found",
		}})
	})
}
