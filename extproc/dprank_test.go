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

// TestDataParallelRankDelivered: the chosen rank reaches the engine in
// x-data-parallel-rank (vLLM's and SGLang's header, case aside), a
// client's own copy never does, and a pool that asks for it gets SGLang's
// routed_dp_rank body field too, in every mode.
func TestDataParallelRankDelivered(t *testing.T) {
	body := `{"model":"m1","prompt":"hi","routed_dp_rank":9,"max_tokens":3}`
	for _, bodyField := range []bool{false, true} {
		for _, m := range allModes {
			t.Run(m.name+"/body_field="+strconv.FormatBool(bodyField), func(t *testing.T) {
				d := &deciderDouble{decide: func(*globalrouter.Request) (*globalrouter.Decision, error) {
					dec := fixedDecision()
					dec.DPRankBodyField = bodyField
					return dec, nil
				}}
				conn, _ := startServer(t, extproc.Config{}, d)
				c := envoyClient(t, conn, m)
				res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
					Headers: post("/v1/completions",
						extprocclient.HeaderField{Key: "x-data-parallel-rank", Value: "9"},
						extprocclient.HeaderField{Key: "content-length", Value: strconv.Itoa(len(body))}),
					Body: [][]byte{[]byte(body[:20]), []byte(body[20:])},
				}})
				if err != nil {
					t.Fatal(err)
				}
				if res.Info.LocalReply != nil {
					t.Fatalf("local reply %d %s", res.Info.LocalReply.Status, res.Info.LocalReply.Body)
				}
				if got, want := res.Upstream.Headers.Values(globalrouter.HeaderDataParallelRank), []string{"2"}; !cmp.Equal(got, want) {
					t.Errorf("upstream %s = %q, want %q", globalrouter.HeaderDataParallelRank, got, want)
				}
				if got := get(res.Upstream.Headers, "x-kvgate-dp-rank"); got != "2" {
					t.Errorf("upstream x-kvgate-dp-rank %q, want 2", got)
				}
				var up map[string]any
				if err := json.Unmarshal(res.Upstream.BodyBytes(), &up); err != nil {
					t.Fatalf("upstream body %q: %v", res.Upstream.BodyBytes(), err)
				}
				want := map[string]any{"model": "m1", "prompt": "hi", "routed_dp_rank": 9.0, "max_tokens": 3.0}
				if bodyField {
					want["routed_dp_rank"] = 2.0
					if cl, ok := res.Upstream.Headers.Get("content-length"); ok && cl != strconv.Itoa(len(res.Upstream.BodyBytes())) {
						t.Errorf("content-length %s for a body of %d bytes", cl, len(res.Upstream.BodyBytes()))
					}
				} else if got := string(res.Upstream.BodyBytes()); got != body {
					t.Errorf("upstream body %q, want it unchanged", got)
				}
				if diff := cmp.Diff(want, up); diff != "" {
					t.Errorf("upstream body (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestClientDataParallelRankRemovedOnPassThrough(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	c := envoyClient(t, conn, allModes[0])
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
		Headers: extprocclient.Headers{
			{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"},
			{Key: ":authority", Value: "gateway.local"}, {Key: ":scheme", Value: "http"},
			{Key: "x-data-parallel-rank", Value: "1"},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := res.Upstream.Headers.Get(globalrouter.HeaderDataParallelRank); ok {
		t.Errorf("client's %s %q reached upstream, want removed", globalrouter.HeaderDataParallelRank, v)
	}
}
