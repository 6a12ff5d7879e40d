package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/chaos"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// TestStatusAndSummary: what `kvgate up` prints names every part's real
// address, and the status page and its JSON (on the admin listener) show
// the pools and workers.
func TestStatusAndSummary(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	sum := s.Summary()
	wants := []string{s.GatewayURL(), s.AdminURL(), s.ExtprocAddr(), s.NATSURL(), s.EtcdEndpoints()[0], "curl -si " + s.GatewayURL() + "/v1/chat/completions"}
	for _, p := range s.Pools {
		wants = append(wants, p.Router.GRPCAddr())
		for _, w := range p.Workers {
			wants = append(wants, w.Addr)
		}
	}
	for _, w := range wants {
		if !strings.Contains(sum, w) {
			t.Errorf("summary lacks %q:\n%s", w, sum)
		}
	}
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	if r := chat(t, ctx, c, s, chatBody("mock-llama", "hi", false, 2)); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	get := func(path string) (string, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", s.AdminURL()+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return resp.Header.Get("content-type"), string(b)
	}
	ctype, page := get("/kvgate/")
	if !strings.HasPrefix(ctype, "text/html") || !strings.Contains(page, "pool-a-w2") || !strings.Contains(page, "pool-b") {
		t.Errorf("status page (%s) lacks the pools and workers:\n%s", ctype, page)
	}
	_, js := get("/kvgate/status.json")
	var st up.Status
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Pools) != 2 || len(st.Pools[0].Workers) != 3 || len(st.Pools[1].Workers) != 2 || st.Pools[0].RouterState != "ok" {
		t.Errorf("status %+v: want pool-a with 3 workers and pool-b with 2, routers ok", st)
	}
	// Each rank's timing model (localrouter calibration): the prior after
	// one request (a pool's fit needs localrouter.CalibrationMinSamples).
	if !strings.Contains(page, "timing prior (") {
		t.Errorf("status page lacks the ranks' timing models:\n%s", page)
	}
	if r := st.Pools[0].Workers[0].Ranks; len(r) == 0 || !strings.HasPrefix(r[0].Timing, "prior (") {
		t.Errorf("status.json ranks %+v: want each rank's timing model, the prior", r)
	}
	if _, m := get("/kvgate/metrics"); !strings.Contains(m, `kvgate_extproc_requests_total{code="200"`) {
		t.Errorf("metrics lack the request:\n%s", m)
	}
}

// TestAllPoolsDown (issue 27 item 4): with every local router stopped, a
// request is routed best effort to a worker the pools learned from their
// routers at start (before, a system that had served nothing answered 503
// no_pool_reachable); one that ends while the routers are down leaves
// nothing behind, and a stream still open when its pool's router comes
// back is committed there (late), then freed when it ends.
func TestAllPoolsDown(t *testing.T) {
	t.Parallel()
	s := startSystem(t, func(c *up.Config) { c.Speedup = 1 })
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	c := httpClient(t)
	for _, p := range s.Pools {
		if err := p.StopRouter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if r := chat(t, ctx, c, s, chatBody("mock-llama", "hi", false, 2)); r.status != 200 {
		t.Fatalf("every router down: status %d reason %q (%s), want 200 routed best effort", r.status, r.header.Get("x-kvgate-dropped-reason"), r.body)
	}
	resp, _ := openStream(t, ctx, c, s, chatBody("mock-llama", "a long answer while the routers are down", true, 2000))
	pool := s.Pool(resp.Header.Get("x-kvgate-pool"))
	if pool == nil {
		t.Fatalf("the stream names no pool of the system: %q", resp.Header.Get("x-kvgate-pool"))
	}
	if err := pool.RestartRouter(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		return fmt.Sprintf("the restarted router of %s counts %d requests, want the open stream", pool.Name, pool.Requests()), pool.Requests() == 1
	})
	resp.Body.Close() // the client goes away mid-answer
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		return fmt.Sprintf("after the stream ended the router counts %d", pool.Requests()), pool.Requests() == 0
	})
	be := chaos.BestEffortCounts(s.Registry)
	if be["decisions"] != 2 || be["ended"] != 1 || be["late_committed"] != 1 {
		t.Errorf("best effort %v: want 2 decisions, 1 ended before a router came back, 1 committed late", be)
	}
}
