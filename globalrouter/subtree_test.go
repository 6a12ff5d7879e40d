package globalrouter_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// routers is a set of in-process routers by the address their parents'
// pools name (globalrouter.SubtreeDialer).
type routers struct {
	mu sync.Mutex
	m  map[string]*globalrouter.Router
}

func (rs *routers) set(addr string, r *globalrouter.Router) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = map[string]*globalrouter.Router{}
	}
	rs.m[addr] = r
}

func (rs *routers) get(addr string) *globalrouter.Router {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.m[addr]
}

func (rs *routers) dialer() pool.Dialer {
	return globalrouter.SubtreeDialer(rs.get, pool.ChannelDialer())
}

// tree is a top router whose one pool, "region-1", is a region router
// answering for its subtree (the cluster's pool-a and pool-b, real local
// routers over gRPC), in process.
type tree struct {
	*cluster
	region, top *globalrouter.Router
}

func newTree(t *testing.T) *tree {
	t.Helper()
	c := newCluster(t)
	rs := &routers{}
	region, _ := newRouter(t, c.cfg, globalrouter.WithDialer(rs.dialer()))
	rs.set("region-1:0", region)
	top := globalrouter.DefaultConfig(pool.NewConfig("region-1", 16, []string{model}, "region-1:0"))
	top.Probe.Timeout = c.cfg.Probe.Timeout
	r, _ := newRouter(t, top, globalrouter.WithDialer(rs.dialer()))
	return &tree{cluster: c, region: region, top: r}
}

func TestSubtreeDecideThroughARegion(t *testing.T) {
	ctx := testenv.Context(t)
	tr := newTree(t)
	msgs := chat(longText(200))
	toks := chatTokens(t, msgs)
	tr.b.Store(t, "b-1", toks)

	d, err := tr.top.Decide(ctx, &globalrouter.Request{ID: "r1", Path: "/v1/chat/completions", Model: model, Chat: tokenizer.NewChat(msgs...), Explain: true})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if d.Primary.Pool != "region-1" || d.Primary.WorkerID != "pool-b/b-1" {
		t.Fatalf("primary = %+v, want region-1, worker pool-b/b-1 (it caches the prompt)\n%s", d.Primary, d.Explanation)
	}
	if want := len(toks) / 16; d.Primary.OverlapBlocks != want {
		t.Errorf("overlap %d, want %d", d.Primary.OverlapBlocks, want)
	}
	if d.Primary.Address == "" {
		t.Error("primary has no address")
	}
	if !strings.Contains(d.Explanation, "pool-b/b-1") {
		t.Errorf("the explanation does not show the path region-1 → pool-b → b-1:\n%s", d.Explanation)
	}
	// The commit went down to pool-b's local router, and nowhere else.
	if err := tr.b.WaitActive(ctx, 1); err != nil {
		t.Fatalf("pool-b: %v", err)
	}
	if a := tr.a.ActiveRequests(); a != 0 {
		t.Errorf("pool-a has %d requests, want 0", a)
	}
	if err := d.Lease.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete: %v", err)
	}
	free(t, d)
	if err := tr.b.WaitIdle(ctx); err != nil {
		t.Errorf("after Free: %v", err)
	}
}

// prompt is toks as a parent sends it: local hashes at block size 16.
func prompt(t *testing.T, toks []uint32) pool.Prompt {
	t.Helper()
	h, err := kvevents.LocalHashes(toks, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	return pool.Prompt{Hashes: h, BlockSize: 16, ISL: len(toks)}
}

func TestSubtreeProbeLoadsCommit(t *testing.T) {
	ctx := testenv.Context(t)
	tr := newTree(t)
	st := tr.region.Subtree()
	toks := chatTokens(t, chat(longText(120)))
	tr.a.Store(t, "a-2", toks)
	p := prompt(t, toks)

	sel, err := st.Probe(ctx, p)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if sel.WorkerID != "pool-a/a-2" || sel.OverlapBlocks != len(toks)/16 || sel.BlockSize != 16 || sel.Candidates != 5 {
		t.Errorf("probe = %+v, want pool-a/a-2 with %d blocks cached, block size 16, 5 candidates", sel, len(toks)/16)
	}
	if tr.a.ActiveRequests()+tr.b.ActiveRequests() != 0 {
		t.Error("a probe changed state")
	}

	loads, err := st.Loads(ctx, p)
	if err != nil {
		t.Fatalf("Loads: %v", err)
	}
	var ids []string
	for _, l := range loads {
		ids = append(ids, l.WorkerID)
	}
	if len(ids) != 5 || !strings.Contains(strings.Join(ids, ","), "pool-b/b-1") {
		t.Errorf("loads name %v, want the 5 workers of pool-a and pool-b, qualified", ids)
	}

	// A commit on a named worker is forwarded to the pool that owns it.
	trk, csel, err := st.Commit(ctx, pool.Commit{RequestID: "named", WorkerID: "pool-b/b-0", Prompt: p})
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if csel.WorkerID != "pool-b/b-0" || tr.b.ActiveRequests() != 1 {
		t.Errorf("commit = %+v, pool-b active %d; want pool-b/b-0, 1", csel, tr.b.ActiveRequests())
	}
	// Decide and commit: the subtree chooses, as Probe would.
	trk2, csel2, err := st.Commit(ctx, pool.Commit{RequestID: "chosen", Prompt: p})
	if err != nil {
		t.Fatalf("decide-and-commit: %v", err)
	}
	if csel2.WorkerID != "pool-a/a-2" || tr.a.ActiveRequests() != 1 {
		t.Errorf("decide-and-commit = %+v, pool-a active %d; want pool-a/a-2, 1", csel2, tr.a.ActiveRequests())
	}
	for _, k := range []pool.Tracker{trk, trk2} {
		if err := k.PrefillComplete(ctx); err != nil {
			t.Errorf("PrefillComplete: %v", err)
		}
		if err := k.Free(ctx); err != nil {
			t.Errorf("Free: %v", err)
		}
	}
	if err := tr.a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
	if err := tr.b.WaitIdle(ctx); err != nil {
		t.Error(err)
	}

	// Refusals: an unknown pool or an unqualified id, a block size no
	// pool has, a dp_rank without a worker.
	for _, id := range []string{"pool-z/b-0", "b-0"} {
		if _, _, err := st.Commit(ctx, pool.Commit{RequestID: "x", WorkerID: id, Prompt: p}); !errors.Is(err, localrouter.ErrUnknownWorker) || status.Code(err) != codes.NotFound {
			t.Errorf("commit on %q: %v, want NOT_FOUND unknown worker", id, err)
		}
	}
	if _, _, err := st.Commit(ctx, pool.Commit{RequestID: "x", WorkerID: "pool-b/nobody", Prompt: p}); !errors.Is(err, localrouter.ErrUnknownWorker) {
		t.Errorf("commit on an unknown worker of a known pool: %v, want unknown worker (from the pool's router)", err)
	}
	p32 := p
	p32.BlockSize = 32
	if _, err := st.Probe(ctx, p32); !errors.Is(err, localrouter.ErrBlockSizeMismatch) || status.Code(err) != codes.InvalidArgument {
		t.Errorf("probe at block size 32: %v, want INVALID_ARGUMENT block size mismatch", err)
	}
	if _, _, err := st.Commit(ctx, pool.Commit{RequestID: "x", DPRank: 1, Prompt: p}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("commit with a dp_rank and no worker: %v, want INVALID_ARGUMENT", err)
	}
	if _, _, err := st.Commit(ctx, pool.Commit{WorkerID: "pool-b/b-0", Prompt: p}); !errors.Is(err, localrouter.ErrEmptyRequestID) {
		t.Errorf("commit without a request id: %v", err)
	}
	if tr.a.ActiveRequests()+tr.b.ActiveRequests() != 0 {
		t.Error("a refused commit left a request")
	}
}

func TestSubtreeRefusesPastMaxDepth(t *testing.T) {
	ctx := testenv.Context(t)
	tr := newTree(t)
	p := prompt(t, chatTokens(t, chat("hello there, this is long enough for one block or two")))
	st := tr.region.Subtree()
	if _, err := st.Probe(pool.WithHops(ctx, globalrouter.DefaultMaxDepth-1), p); err != nil {
		t.Errorf("probe at the deepest allowed hop: %v", err)
	}
	_, err := st.Probe(pool.WithHops(ctx, globalrouter.DefaultMaxDepth), p)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "routing loop or tree deeper than 8") || !globalrouter.IsRoutingLoop(err) {
		t.Errorf("probe past the max depth: %v, want FAILED_PRECONDITION routing loop or tree deeper than 8", err)
	}
	if _, err := st.CommitAsync(pool.WithHops(ctx, 8), pool.Commit{RequestID: "x", WorkerID: "pool-a/a-0", Prompt: p}, nil); !globalrouter.IsRoutingLoop(err) {
		t.Errorf("commit past the max depth: %v, want a routing loop", err)
	}
	if tr.a.ActiveRequests() != 0 {
		t.Error("a refused commit landed")
	}
}

// Two routers that name each other as a pool: the loop is not visible to
// either configuration, and the hop count stops it.
func TestSubtreeLoopAtRunTime(t *testing.T) {
	ctx := testenv.Context(t)
	rs := &routers{}
	cfgA := globalrouter.DefaultConfig(pool.NewConfig("to-b", 16, []string{model}, "router-b:0"))
	cfgB := globalrouter.DefaultConfig(pool.NewConfig("to-a", 16, []string{model}, "router-a:0"))
	a, _ := newRouter(t, cfgA, globalrouter.WithDialer(globalrouter.SubtreeDialer(rs.get, nil)))
	b, _ := newRouter(t, cfgB, globalrouter.WithDialer(globalrouter.SubtreeDialer(rs.get, nil)))
	rs.set("router-a:0", a)
	rs.set("router-b:0", b)

	p := prompt(t, chatTokens(t, chat("a loop between two routers, long enough for blocks")))
	_, err := a.Subtree().Probe(ctx, p)
	if !globalrouter.IsRoutingLoop(err) || !strings.Contains(err.Error(), "routing loop or tree deeper than 8") {
		t.Fatalf("probe of a loop: %v, want a routing loop refusal", err)
	}
	// From a top-level decision too: the loop is the cause, not an outage.
	_, err = a.Decide(ctx, &globalrouter.Request{ID: "r1", Model: model, Chat: tokenizer.NewChat(chat("a loop, decided from the top, long enough")...)})
	if !errors.Is(err, globalrouter.ErrRoutingLoop) {
		t.Errorf("Decide over a loop: %v, want it to name the routing loop", err)
	}
}

func TestSubtreeLoopAtConfigLoad(t *testing.T) {
	self := globalrouter.WithSubtree(globalrouter.SubtreeOptions{Addresses: []string{"127.0.0.1:9100", "router.example:9100"}, Pool: "region-1"})
	for _, tt := range []struct {
		name string
		cfg  globalrouter.Config
		want string
	}{
		{"own address", globalrouter.DefaultConfig(pool.NewConfig("p", 16, []string{model}, "127.0.0.1:9100")), `routers.static "127.0.0.1:9100" is this router's own subtree address`},
		{"own address as localhost", globalrouter.DefaultConfig(pool.NewConfig("p", 16, []string{model}, "localhost:9100")), "routing loop"},
		{"advertised address", globalrouter.DefaultConfig(pool.NewConfig("p", 16, []string{model}, "router.example:9100")), "routing loop"},
		{"own pool", globalrouter.DefaultConfig(pool.NewConfig("region-1", 16, []string{model}, "127.0.0.1:9200")), `pool "region-1": this router answers for its subtree as a router of pool "region-1"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := globalrouter.New(tt.cfg, globalrouter.WithLogger(quiet()), globalrouter.WithTokenizer(model, sharedTokenizer(t)), self)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want an error with %q", err, tt.want)
			}
		})
	}
	// Another port, another pool: fine; and a reload into a loop is refused.
	ok := globalrouter.DefaultConfig(pool.NewConfig("p", 16, []string{model}, "127.0.0.1:9101"))
	r, _ := newRouter(t, ok, self)
	bad := globalrouter.DefaultConfig(pool.NewConfig("p", 16, []string{model}, "[::1]:9100"))
	if err := r.Reload(bad); err == nil || !strings.Contains(err.Error(), "routing loop") {
		t.Errorf("Reload into a loop: %v, want refused", err)
	}
	if got := r.Config().Pools[0].Routers.Static[0]; got != "127.0.0.1:9101" {
		t.Errorf("after the refused reload the router runs %q", got)
	}
}

// The subtree's cost is its winner's local-router cost (milliseconds)
// divided by the winning pool's scale in the subtree's cost policy: a
// parent's cost policy then compares pools of different subtrees in
// milliseconds, each pool's speed declared where it is configured.
func TestSubtreeNormalisedCost(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	direct := c.b.Router
	cfg := c.cfg
	cfg.Pools = []pool.Config{cfg.Pools[1]} // pool-b alone: it wins
	cfg.Pools[0].Policy = policies.PoolSection{"cost": section(policies.CostPool{Scale: 4})}
	region, _ := newRouter(t, cfg)
	toks := chatTokens(t, chat(longText(80)))
	p := prompt(t, toks)
	sel, err := region.Subtree().Probe(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	want, err := direct.BestWorker(ctx, localrouter.Request{LocalHashes: p.Hashes, BlockSize: 16, ISL: p.ISL}, localrouter.BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel.Cost != want.Cost/4 || want.Cost == 0 {
		t.Errorf("subtree cost %g, want the local router's %g / scale 4", sel.Cost, want.Cost)
	}
}
