package extproc_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/tokenizer"
)

// TestBodyReemittedUnchanged sends bodies in chunks of every awkward shape:
// over the 62,000-byte limit, split inside UTF-8 sequences and inside JSON
// strings; the upstream must see the same bytes, each chunk within the limit.
func TestBodyReemittedUnchanged(t *testing.T) {
	long := strings.Repeat("Ünïcödé prefix 世界 \\\"esc\\\" ", 9000) // ~250 KB
	big := []byte(`{"model":"m1","messages":[{"role":"user","content":"` + long + `"}]}`)
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{}, d)
			c := envoyClient(t, conn, m)
			for _, split := range [][]int{{len(big)}, {1, 70000, 3, 100000}, {62000, 62001}, {7, 7, 7}} {
				chunks := splitAt(big, split)
				ctx := testenv.Context(t)
				s := c.Open(ctx, nil)
				if err := s.SendRequestHeaders(ctx, post("/v1/chat/completions"), false); err != nil {
					t.Fatal(err)
				}
				for i, ch := range chunks {
					if err := s.SendRequestData(ctx, ch, i == len(chunks)-1); err != nil {
						t.Fatal(err)
					}
				}
				var got []byte
				for {
					f, err := s.ReadUpstream(ctx)
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if f.Kind == extprocclient.FrameData {
						if m.req == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED && len(f.Data) > extproc.MaxChunkBytes {
							t.Errorf("re-emitted chunk of %d bytes, want ≤ %d", len(f.Data), extproc.MaxChunkBytes)
						}
						got = append(got, f.Data...)
					}
				}
				s.Close()
				if !bytes.Equal(got, big) {
					t.Fatalf("split %v: upstream body differs (%d bytes, want %d)", split, len(got), len(big))
				}
			}
			for _, r := range d.requests() {
				if chatMessages(r)[0].Content != strings.ReplaceAll(long, `\"`, `"`) {
					t.Fatal("decider saw a different prompt")
				}
			}
		})
	}
}

// TestDuplicateKeysLast: with DuplicateKeys last, the decider sees the
// body as the engine will run it (Python's json: the last occurrence, at
// every depth), so {"model":"m1","model":"m2"} is routed for m2.
func TestDuplicateKeysLast(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{DuplicateKeys: tokenizer.DuplicatesLast}, d)
	c := envoyClient(t, conn, allModes[1])
	body := []byte(`{"model":"m1","stream":false,"messages":[{"role":"user","content":"first","content":"last"}],"model":"m2","stream":true}`)
	res, err := c.Process(testenv.Context(t), extprocclient.Request{
		Message:  extprocclient.Message{Headers: post("/v1/chat/completions"), Body: [][]byte{body}},
		Upstream: sseResponse("ok"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Info.LocalReply != nil {
		t.Fatalf("local reply %d: %s", res.Info.LocalReply.Status, res.Info.LocalReply.Body)
	}
	if !bytes.Equal(res.Upstream.BodyBytes(), body) {
		t.Errorf("upstream body %s, want it as it came", res.Upstream.BodyBytes())
	}
	reqs := d.requests()
	if len(reqs) != 1 || reqs[0].Model != "m2" || chatMessages(reqs[0])[0].Content != "last" {
		t.Fatalf("decider saw %+v, want model m2 and content last", reqs)
	}
}

// splitAt cuts b into chunks of the given sizes (the last takes the rest).
func splitAt(b []byte, sizes []int) [][]byte {
	var out [][]byte
	for _, n := range sizes {
		if len(b) == 0 {
			break
		}
		n = min(n, len(b))
		out = append(out, b[:n])
		b = b[n:]
	}
	if len(b) > 0 {
		out = append(out, b)
	}
	return out
}

// TestEverySplitPoint splits a small body with multi-byte characters and
// escapes in two at every byte, in FDS (where Envoy forwards each chunk).
func TestEverySplitPoint(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	body := []byte(chatBody)
	for i := 1; i < len(body); i++ {
		res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
			Headers: post("/v1/chat/completions"),
			Body:    [][]byte{body[:i], body[i:]},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Info.LocalReply != nil {
			t.Fatalf("split at %d: local reply %d %s (%s)", i, res.Info.LocalReply.Status, res.Info.LocalReply.Body, res.Info.LocalReply.Details)
		}
		if got := string(res.Upstream.BodyBytes()); got != chatBody {
			t.Fatalf("split at %d: upstream body %q", i, got)
		}
	}
	for i, r := range d.requests() {
		if got, want := chatMessages(r)[1].Content, "héllo 世界, \"quoted\""; got != want {
			t.Fatalf("split at %d: content %q, want %q", i+1, got, want)
		}
	}
}

func TestRequestTrailers(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{}, d)
			c := envoyClient(t, conn, m)
			res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
				Headers:  post("/v1/completions"),
				Body:     [][]byte{[]byte(`{"model":"m1",`), []byte(`"prompt":"hi"}`)},
				Trailers: extprocclient.Headers{{Key: "x-checksum", Value: "1"}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Info.LocalReply != nil {
				t.Fatalf("local reply %d %s", res.Info.LocalReply.Status, res.Info.LocalReply.Body)
			}
			if got := get(res.Upstream.Headers, "x-kvgate-pool"); got != "pool-a" {
				t.Errorf("x-kvgate-pool %q, want pool-a", got)
			}
			if got := string(res.Upstream.BodyBytes()); got != `{"model":"m1","prompt":"hi"}` {
				t.Errorf("upstream body %q", got)
			}
			if got := get(res.Upstream.Trailers, "x-checksum"); got != "1" {
				t.Errorf("upstream trailer x-checksum %q, want 1", got)
			}
		})
	}
}

func TestBodylessPostRefused(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	c := envoyClient(t, conn, allModes[0])
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{Headers: post("/v1/completions")}})
	if err != nil {
		t.Fatal(err)
	}
	if lr := res.Info.LocalReply; lr == nil || lr.Status != 400 {
		t.Fatalf("local reply %+v, want 400", lr)
	}
}

// TestLargeBufferedBody: a BUFFERED body arrives as one gRPC message,
// larger than gRPC's 4 MiB default; up to the cap it routes, past it 413.
func TestLargeBufferedBody(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{MaxBodyBytes: 8 << 20}, d)
	c := envoyClient(t, conn, allModes[2])
	for _, tc := range []struct {
		size   int
		status int
	}{{6 << 20, 0}, {8<<20 + 100, 413}} {
		body := []byte(`{"model":"m1","prompt":"` + strings.Repeat("x", tc.size) + `"}`)
		res, err := c.Process(testenv.Context(t), extprocclient.Request{
			Message:  extprocclient.Message{Headers: post("/v1/completions"), Body: [][]byte{body}},
			Upstream: sseResponse("ok"),
		})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		if lr := res.Info.LocalReply; lr != nil {
			got = lr.Status
		}
		if got != tc.status {
			t.Errorf("%d-byte body: local reply %d, want %d (0: routed)", len(body), got, tc.status)
		}
	}
}
