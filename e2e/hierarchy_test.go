package e2e

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// TestRegionsTopology runs `kvgate up --topology regions`: the global
// router behind the gateway routes over two pools that are region routers
// (each serving its subtree of two pools, discovered in etcd). Requests
// reach workers in both regions, x-kvgate-explain shows the path (region,
// pool, worker), and afterwards, a client that went away mid-stream
// included, no local router and no region router holds a request.
func TestRegionsTopology(t *testing.T) {
	t.Parallel()
	s := startSystem(t, func(c *up.Config) { c.Topology, c.Pools = up.TopologyRegions, up.RegionPools(2) })
	if len(s.Regions) != 2 || len(s.Pools) != 4 {
		t.Fatalf("%d regions, %d pools; want 2 and 4", len(s.Regions), len(s.Pools))
	}
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)

	// Concurrent requests of distinct prompts spread by load; a region no
	// request reached is then asked for by name (x-kvgate-pool, honoured
	// on loopback), which still goes through its router's own decision.
	var mu sync.Mutex
	seen := map[string][]reply{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			r := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt(fmt.Sprint("topic", i), i), false, 4), "x-kvgate-explain", "1")
			mu.Lock()
			defer mu.Unlock()
			seen[r.pool] = append(seen[r.pool], r)
		})
	}
	wg.Wait()
	for _, rg := range []string{"region-a", "region-b"} {
		if len(seen[rg]) == 0 {
			r := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt("pinned", 0), false, 4), "x-kvgate-explain", "1", "x-kvgate-pool", rg)
			seen[r.pool] = append(seen[r.pool], r)
		}
	}
	for pool, rs := range seen {
		rg := s.Region(pool)
		if rg == nil {
			t.Errorf("x-kvgate-pool %q is not a region (%d replies; first %d: %s)", pool, len(rs), rs[0].status, rs[0].body)
			continue
		}
		for _, r := range rs {
			if r.status != 200 {
				t.Errorf("status %d: %s", r.status, r.body)
				continue
			}
			// region-a-p1/region-a-p1-w0: the pool below the region, then
			// the worker in it.
			sub, worker, ok := strings.Cut(r.worker, "/")
			p := s.Pool(sub)
			if !ok || p == nil || !strings.HasPrefix(sub, pool+"-") {
				t.Errorf("x-kvgate-worker-id %q: want one of %s's pools, then a worker", r.worker, pool)
				continue
			}
			var addr string
			for _, w := range p.Workers {
				if w.ID == worker {
					addr = w.Addr
				}
			}
			if addr == "" || r.header.Get("x-kvgate-endpoint") != addr {
				t.Errorf("worker %q of %s at %q: x-kvgate-endpoint %q", worker, sub, addr, r.header.Get("x-kvgate-endpoint"))
			}
			if ex := r.header.Get("x-kvgate-explain"); !strings.Contains(ex, pool) || !strings.Contains(ex, r.worker) {
				t.Errorf("x-kvgate-explain does not show the path %s → %s:\n%s", pool, r.worker, ex)
			}
		}
	}
	if len(seen["region-a"]) == 0 || len(seen["region-b"]) == 0 {
		t.Errorf("replies by region: a %d, b %d; want both", len(seen["region-a"]), len(seen["region-b"]))
	}
	waitTreeIdle(t, s)

	// A client that goes away mid-stream: the ext_proc stream ends, the
	// top router frees its lease on the region, and the region frees the
	// request on its pool's local router.
	sctx, cancel := context.WithCancel(ctx)
	resp := postChat(t, sctx, c, s.GatewayURL(), chatBody("mock-llama", longPrompt("abandoned", 1), true, 2000))
	if resp.StatusCode != 200 {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	held := 0
	for _, p := range s.Pools {
		held += p.Requests()
	}
	if held != 1 {
		t.Errorf("mid-stream, %d requests in flight on the local routers, want 1", held)
	}
	cancel()
	resp.Body.Close()
	waitTreeIdle(t, s)
}

// waitTreeIdle is waitIdle over the local routers and the region routers'
// subtree services.
func waitTreeIdle(t testing.TB, s *up.System) {
	t.Helper()
	waitIdle(t, s)
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		for _, rg := range s.Regions {
			if n := rg.Server.Active(); n != 0 {
				return fmt.Sprintf("region %s: %d requests in flight through its subtree", rg.Name, n), false
			}
		}
		return "", true
	})
}
