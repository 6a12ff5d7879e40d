package extproc

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzWithBodyFields: whatever JSON object a client sends, the rewritten
// body is a JSON object whose cache_salt is exactly the tenant's salt and
// routed_dp_rank the rank, every other key kept with an equal value; a body
// that is not an object is an error, never a panic.
func FuzzWithBodyFields(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","cache_salt":"mine"}`,
		`{"model":"m","messages":[{"role":"user","content":"<x>"}],"routed_dp_rank":9}`,
		`{}`, `[]`, `null`, `{"cache_salt":5}`, "{\"a\":\"\\u0000\"}",
	} {
		f.Add([]byte(s), "kvgate-tenant:acme\x00mine", uint32(2))
	}
	f.Fuzz(func(t *testing.T, body []byte, salt string, rank uint32) {
		if !utf8.ValidString(salt) {
			return // the router never names one (globalrouter refuses such a tenant)
		}
		var in map[string]json.RawMessage
		inErr := json.Unmarshal(body, &in)
		out, err := withBodyFields(body, &rank, salt)
		if inErr != nil || in == nil {
			if err == nil {
				t.Fatalf("body %q: no error, want one", body)
			}
			return
		}
		if err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("rewritten %q: %v", out, err)
		}
		var gotSalt string
		if salt != "" {
			if err := json.Unmarshal(got["cache_salt"], &gotSalt); err != nil || gotSalt != salt {
				t.Fatalf("cache_salt %s, want %q", got["cache_salt"], salt)
			}
		}
		var gotRank uint32
		if err := json.Unmarshal(got["routed_dp_rank"], &gotRank); err != nil || gotRank != rank {
			t.Fatalf("routed_dp_rank %s, want %d", got["routed_dp_rank"], rank)
		}
		for k, v := range in {
			if k == "cache_salt" && salt != "" || k == "routed_dp_rank" {
				continue
			}
			var a, b any
			_ = json.Unmarshal(v, &a)
			_ = json.Unmarshal(got[k], &b)
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			if !bytes.Equal(ja, jb) {
				t.Fatalf("key %q: %s became %s", k, v, got[k])
			}
		}
	})
}
