package extproc_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestTenantCacheSaltDelivered: a decision with a tenant's salt
// (Decision.CacheSalt, the client's own salt already inside it) reaches
// the engine as the body's cache_salt, the client's copy
// replaced, with SGLang's routed_dp_rank alongside when the pool asks, and
// content-length matching, in every body mode; without one the body goes
// as it came.
func TestTenantCacheSaltDelivered(t *testing.T) {
	body := `{"model":"m1","prompt":"hi","cache_salt":"mine","max_tokens":3}`
	for _, salt := range []string{"", globalrouter.TenantSaltPrefix + "acme\x00mine"} {
		for _, bodyField := range []bool{false, true} {
			for _, m := range allModes {
				t.Run(m.name+"/salted="+strconv.FormatBool(salt != "")+"/body_field="+strconv.FormatBool(bodyField), func(t *testing.T) {
					d := &deciderDouble{decide: func(*globalrouter.Request) (*globalrouter.Decision, error) {
						dec := fixedDecision()
						dec.DPRankBodyField, dec.CacheSalt = bodyField, salt
						return dec, nil
					}}
					conn, _ := startServer(t, extproc.Config{}, d)
					c := envoyClient(t, conn, m)
					res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
						Headers: post("/v1/completions", extprocclient.HeaderField{Key: "content-length", Value: strconv.Itoa(len(body))}),
						Body:    [][]byte{[]byte(body[:30]), []byte(body[30:])},
					}})
					if err != nil {
						t.Fatal(err)
					}
					if res.Info.LocalReply != nil {
						t.Fatalf("local reply %d %s", res.Info.LocalReply.Status, res.Info.LocalReply.Body)
					}
					got := res.Upstream.BodyBytes()
					if salt == "" && !bodyField {
						if string(got) != body {
							t.Errorf("upstream body %q, want it unchanged", got)
						}
						return
					}
					if cl, ok := res.Upstream.Headers.Get("content-length"); ok && cl != strconv.Itoa(len(got)) {
						t.Errorf("content-length %s for a body of %d bytes", cl, len(got))
					}
					var up map[string]any
					if err := json.Unmarshal(got, &up); err != nil {
						t.Fatalf("upstream body %q: %v", got, err)
					}
					want := map[string]any{"model": "m1", "prompt": "hi", "cache_salt": "mine", "max_tokens": 3.0}
					if salt != "" {
						want["cache_salt"] = salt
					}
					if bodyField {
						want["routed_dp_rank"] = 2.0
					}
					if diff := cmp.Diff(want, up); diff != "" {
						t.Errorf("upstream body (-want +got):\n%s", diff)
					}
				})
			}
		}
	}
}
