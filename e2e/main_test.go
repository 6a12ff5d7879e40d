package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/internal/uptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...) }

const testTimeout = 60 * time.Second

// startSystem starts `kvgate up`'s parts on free ports, with mock workers
// sped up so tests run quickly; everything stops at cleanup.
func startSystem(t testing.TB, mutate ...func(*up.Config)) *up.System {
	t.Helper()
	fast := func(c *up.Config) { c.Speedup, c.NumBlocks = 20, 2048 }
	return uptest.Start(t, append([]func(*up.Config){fast}, mutate...)...)
}

// fixedProbes gives the global router a fixed, generous probe deadline
// (up.Config.ProbeTimeout) instead of the adaptive one (as short as
// 25 ms): for the tests that check where the cache sends a request, a
// probe that a loaded machine let run past its deadline leaves its pool,
// and the cache in it, out of the decision.
func fixedProbes(c *up.Config) { c.ProbeTimeout = 10 * time.Second }

// httpClient is a client whose idle connections close at cleanup.
func httpClient(t testing.TB) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

type reply struct {
	status  int
	header  http.Header
	body    []byte
	events  []string // SSE data payloads
	pool    string
	worker  string
	overlap int
}

// chat posts a chat completion through the gateway and reads the whole
// response.
func chat(t testing.TB, ctx context.Context, c *http.Client, s *up.System, body string, hdr ...string) reply {
	t.Helper()
	return chatURL(t, ctx, c, s.GatewayURL(), body, hdr...)
}

// postChat posts a chat completion body to the gateway at base, with
// headers as name, value pairs, and returns the response, body unread.
func postChat(t testing.TB, ctx context.Context, c *http.Client, base, body string, hdr ...string) *http.Response {
	t.Helper()
	return send(t, ctx, c, "POST", base+"/v1/chat/completions", body, hdr...)
}

// send sends a JSON body (content-type application/json) with headers as
// name, value pairs, and returns the response, body unread.
func send(t testing.TB, ctx context.Context, c *http.Client, method, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// chatURL is chat against the gateway at base.
func chatURL(t testing.TB, ctx context.Context, c *http.Client, base, body string, hdr ...string) reply {
	t.Helper()
	resp := postChat(t, ctx, c, base, body, hdr...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, body: b,
		pool: resp.Header.Get("x-kvgate-pool"), worker: resp.Header.Get("x-kvgate-worker-id")}
	fmt.Sscan(resp.Header.Get("x-kvgate-overlap-blocks"), &r.overlap)
	if strings.HasPrefix(resp.Header.Get("content-type"), "text/event-stream") {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				r.events = append(r.events, d)
			}
		}
	}
	return r
}

func chatBody(model, content string, stream bool, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{
		"model": model, "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "system", "content": "You are terse."}, {"role": "user", "content": content}},
	})
	return string(b)
}

// longPrompt is a prompt of many blocks; variant changes only its end.
func longPrompt(topic string, variant int) string {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "Section %d of the %s handbook explains how a cached prefix saves prefill work. ", i, topic)
	}
	fmt.Fprintf(&b, "Question %d: what follows?", variant)
	return b.String()
}

// waitIdle polls until no local router tracks a request in flight.
func waitIdle(t testing.TB, s *up.System) {
	t.Helper()
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		for _, p := range s.Pools {
			if n := p.Requests(); n != 0 {
				return fmt.Sprintf("pool %s: %d requests in flight, loads %v", p.Name, n, p.Loads()), false
			}
			for k, l := range p.Loads() {
				if l.ActiveRequests != 0 || l.PrefillTokens != 0 || l.ActiveBlocks != 0 {
					return fmt.Sprintf("pool %s worker %v: load %+v", p.Name, k, l), false
				}
			}
		}
		return "", true
	})
}
