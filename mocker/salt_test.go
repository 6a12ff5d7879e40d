package mocker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestCacheSaltPartitionsCache: as in vLLM (the salt is the first block's
// extra key), a salted prompt hits only its own salt's blocks: the same
// prompt under another salt, or unsalted, gets 0 cached tokens, and an
// empty cache_salt is a 400 as vLLM's validator answers.
func TestCacheSaltPartitionsCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, hs, _ := startServer(t, ServerConfig{Model: "m"})
	prompt := `[` + strings.TrimSuffix(strings.Repeat("9,", 40), ",") + `]`
	cached := func(path, extra string) float64 {
		t.Helper()
		body := `{"model":"m","prompt":` + prompt + `,"max_tokens":2` + extra + `}`
		if path == "/v1/chat/completions" {
			body = `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("tenant words ", 20) + `"}],"max_tokens":2` + extra + `}`
		}
		resp := post(ctx, t, hs.URL+path, body, nil)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s %s: %d %s", path, extra, resp.StatusCode, b)
		}
		var out struct {
			Usage struct {
				Details struct {
					Cached float64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out.Usage.Details.Cached
	}
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		steps := []struct {
			extra string
			want  bool // some cached tokens
		}{
			{`,"cache_salt":"a"`, false},
			{`,"cache_salt":"a"`, true},
			{`,"cache_salt":"b"`, false},
			{``, false},
			{``, true},
			{`,"cache_salt":"b"`, true},
		}
		for i, s := range steps {
			if got := cached(path, s.extra); (got > 0) != s.want {
				t.Errorf("%s step %d (%s): cached %v, want cached %v", path, i, s.extra, got, s.want)
			}
		}
	}
	resp := post(ctx, t, hs.URL+"/v1/completions", `{"model":"m","prompt":"x","cache_salt":""}`, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("empty cache_salt: %d, want 400", resp.StatusCode)
	}
}
