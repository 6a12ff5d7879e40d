package inproc_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/inproc"
	"github.com/kvgate/kvgate/pool"
)

const localBS = 4

// localRouter is a router of workers w0..w(n-1), worker i at 10.0.0.i:8000.
func localRouter(t *testing.T, n int) (*localrouter.Router, func(localrouter.WorkerKey) string) {
	t.Helper()
	cfg := localrouter.DefaultConfig()
	cfg.BlockSize = localBS
	r, err := localrouter.New(cfg, localrouter.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	for i := range n {
		r.AddWorker(fmt.Sprintf("w%d", i), 1)
	}
	return r, func(k localrouter.WorkerKey) string { return "10.0.0." + k.ID[1:] + ":8000" }
}

// localPrompt is a prompt of blocks whose tokens start at base.
func localPrompt(t *testing.T, base uint32, blocks int) (pool.Prompt, []uint32) {
	t.Helper()
	toks := make([]uint32, blocks*localBS)
	for i := range toks {
		toks[i] = base + uint32(i)
	}
	h, err := kvevents.AppendLocalHashes(nil, toks, localBS, "")
	if err != nil {
		t.Fatal(err)
	}
	return pool.Prompt{Hashes: h, BlockSize: localBS, ISL: len(toks)}, toks
}

// cache stores toks' blocks on worker w, as its engine's KV event would.
func cache(t *testing.T, r *localrouter.Router, w string, toks []uint32) {
	t.Helper()
	var blocks []kvevents.Block
	for i := 0; i+localBS <= len(toks); i += localBS {
		blocks = append(blocks, kvevents.Block{EngineHash: uint64(1000 + i), TokenIDs: toks[i : i+localBS]})
	}
	if err := r.ApplyEvent(kvevents.RouterEvent{WorkerID: w, EventID: 1, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: blocks}}}); err != nil {
		t.Fatal(err)
	}
}

type answer struct {
	sel routing.Selection
	err error
}

func commitAndWait(t *testing.T, c pool.Client, cm pool.Commit) (pool.Tracker, answer) {
	t.Helper()
	ch := make(chan answer, 2)
	tr, err := c.CommitAsync(context.Background(), cm, func(sel routing.Selection, err error) { ch <- answer{sel, err} })
	if err != nil {
		t.Fatalf("CommitAsync: %v", err)
	}
	a := <-ch
	select {
	case b := <-ch:
		t.Fatalf("committed called twice: %+v then %+v", a, b)
	case <-time.After(20 * time.Millisecond):
	}
	return tr, a
}

func TestLocalProbeIsStateFreeAndNamesAddresses(t *testing.T) {
	r, addr := localRouter(t, 3)
	c := inproc.New(r, addr)
	p, toks := localPrompt(t, 1, 4)
	cache(t, r, "w2", toks)
	sel, err := c.Probe(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != "w2" || sel.Address != "10.0.0.2:8000" || sel.OverlapBlocks != 4 {
		t.Fatalf("probe = %+v, want w2 at 10.0.0.2:8000 with 4 blocks cached", sel)
	}
	if n := r.Active().Load(localrouter.WorkerKey{ID: "w2"}).ActiveRequests; n != 0 {
		t.Fatalf("a probe recorded %d requests", n)
	}
	// Allowed restricts the choice to the listed addresses.
	p.Allowed = []string{"10.0.0.1:8000"}
	if sel, err = c.Probe(context.Background(), p); err != nil || sel.WorkerID != "w1" {
		t.Fatalf("probe within {w1} = %+v, %v; want w1", sel, err)
	}
	p.Allowed = []string{"10.9.9.9:8000"}
	_, err = c.Probe(context.Background(), p)
	if !errors.Is(err, localrouter.ErrNoAllowedWorker) || status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("probe outside the pool: %v (code %v), want ErrNoAllowedWorker as FailedPrecondition", err, status.Code(err))
	}
	// Override reaches the router: a negative credit is refused there.
	p.Allowed = nil
	neg := -1.0
	p.Override = &routing.Override{OverlapScoreCredit: &neg}
	if _, err = c.Probe(context.Background(), p); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("probe with a negative credit: %v (code %v), want InvalidArgument", err, status.Code(err))
	}
}

func TestLocalLoads(t *testing.T) {
	r, addr := localRouter(t, 3)
	c := inproc.New(r, addr)
	p, toks := localPrompt(t, 1, 4)
	cache(t, r, "w1", toks[:2*localBS])
	ls, err := c.Loads(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 {
		t.Fatalf("%d loads, want 3", len(ls))
	}
	for _, l := range ls {
		want := 0
		if l.WorkerID == "w1" {
			want = 2
		}
		if l.OverlapBlocks != want || l.Address != addr(localrouter.WorkerKey{ID: l.WorkerID}) || l.PrefillTokens != p.ISL-want*localBS {
			t.Errorf("load %+v: want overlap %d, prefill %d, its address", l, want, p.ISL-want*localBS)
		}
	}
}

func TestLocalCommitOnNamedWorkerAndTracker(t *testing.T) {
	r, addr := localRouter(t, 2)
	c := inproc.New(r, addr)
	p, _ := localPrompt(t, 1, 4)
	tr, a := commitAndWait(t, c, pool.Commit{RequestID: "a", WorkerID: "w1", Prompt: p})
	if a.err != nil || a.sel.WorkerID != "w1" || a.sel.Address != "10.0.0.1:8000" {
		t.Fatalf("committed(%+v, %v), want w1 at its address", a.sel, a.err)
	}
	k, ok := r.Active().Has("a")
	if !ok || k.ID != "w1" {
		t.Fatalf("request a on %v (%v), want w1", k, ok)
	}
	if got := r.Active().Load(k).PrefillTokens; got != p.ISL {
		t.Fatalf("prefill tokens %d, want %d", got, p.ISL)
	}
	for range 2 { // idempotent
		if err := tr.PrefillComplete(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.Active().Load(k).PrefillTokens; got != 0 {
		t.Fatalf("prefill tokens %d after PrefillComplete, want 0", got)
	}
	for range 2 {
		if err := tr.Free(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := r.Active().Has("a"); ok {
		t.Fatal("request a still on the router after Free")
	}
	if err := tr.PrefillComplete(context.Background()); err != nil {
		t.Fatalf("PrefillComplete after Free: %v", err)
	}
}

func TestLocalDecideAndCommit(t *testing.T) {
	r, addr := localRouter(t, 4)
	c := inproc.New(r, addr)
	p, toks := localPrompt(t, 1, 4)
	cache(t, r, "w3", toks)
	tr, a := commitAndWait(t, c, pool.Commit{RequestID: "a", Prompt: p})
	if a.err != nil || a.sel.WorkerID != "w3" || a.sel.OverlapBlocks != 4 {
		t.Fatalf("decide and commit: (%+v, %v), want w3 with 4 cached blocks", a.sel, a.err)
	}
	if k, ok := r.Active().Has("a"); !ok || k.ID != "w3" {
		t.Fatalf("request a on %v (%v), want w3", k, ok)
	}
	// A second identical commit is a duplicate id: refused by the router.
	tr2, b := commitAndWait(t, c, pool.Commit{RequestID: "a", Prompt: p})
	if !errors.Is(b.err, localrouter.ErrDuplicateRequest) || status.Code(b.err) != codes.AlreadyExists {
		t.Fatalf("duplicate commit: %v, want ErrDuplicateRequest as AlreadyExists", b.err)
	}
	if err := tr2.Free(context.Background()); err != nil {
		t.Fatalf("Free of a refused commit: %v", err)
	}
	if _, ok := r.Active().Has("a"); !ok {
		t.Fatal("freeing the refused duplicate freed the first request")
	}
	_ = tr.Free(context.Background())
}

func TestLocalRefusedCommit(t *testing.T) {
	r, addr := localRouter(t, 2)
	c := inproc.New(r, addr)
	p, _ := localPrompt(t, 1, 2)
	tr, a := commitAndWait(t, c, pool.Commit{RequestID: "a", WorkerID: "nope", Prompt: p})
	if !errors.Is(a.err, pool.ErrUnknownWorker) || status.Code(a.err) != codes.NotFound {
		t.Fatalf("commit on an unknown worker: %v (code %v), want ErrUnknownWorker as NotFound", a.err, status.Code(a.err))
	}
	if err := tr.PrefillComplete(context.Background()); !errors.Is(err, pool.ErrUnknownWorker) {
		t.Fatalf("PrefillComplete of a refused commit: %v, want the refusal", err)
	}
	if err := tr.Free(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CommitAsync(context.Background(), pool.Commit{WorkerID: "w0", Prompt: p}, nil); !errors.Is(err, localrouter.ErrEmptyRequestID) {
		t.Fatalf("commit without id: %v, want ErrEmptyRequestID", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.CommitAsync(ctx, pool.Commit{RequestID: "b", WorkerID: "w0", Prompt: p}, func(routing.Selection, error) {
		t.Error("committed called after CommitAsync failed")
	}); !errors.Is(err, context.Canceled) {
		t.Fatalf("commit with an ended context: %v", err)
	}
	if _, ok := r.Active().Has("b"); ok {
		t.Fatal("a failed CommitAsync committed")
	}
}

func TestLocalCloseFreesOpenTrackers(t *testing.T) {
	r, addr := localRouter(t, 2)
	c := inproc.New(r, addr)
	p, _ := localPrompt(t, 1, 2)
	tr, _ := commitAndWait(t, c, pool.Commit{RequestID: "a", WorkerID: "w0", Prompt: p})
	commitAndWait(t, c, pool.Commit{RequestID: "b", WorkerID: "w1", Prompt: p})
	if err := tr.Free(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Active().Has("b"); ok {
		t.Fatal("Close left request b on the router")
	}
	if _, err := c.Probe(context.Background(), p); !errors.Is(err, pool.ErrClosed) {
		t.Fatalf("probe after Close: %v, want ErrClosed", err)
	}
}

func TestLocalDialer(t *testing.T) {
	r, addr := localRouter(t, 2)
	l := inproc.New(r, addr)
	dial := pool.LocalDialer(map[string]pool.Client{"a": l})
	c, err := dial(pool.LocalAddress("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	p, _ := localPrompt(t, 1, 2)
	if _, err := l.Probe(context.Background(), p); err != nil {
		t.Fatalf("closing a dialed client closed the shared one: %v", err)
	}
	for _, bad := range []string{"local:b", "127.0.0.1:7000", ""} {
		if _, err := dial(bad); err == nil {
			t.Errorf("dial %q: no error", bad)
		}
	}
}

// TestLocalThroughPool drives a Pool over the local dialer: probes go
// through its circuit and come back naming the router, the commit and the
// tracker reach the router.
func TestLocalThroughPool(t *testing.T) {
	r, addr := localRouter(t, 3)
	conns := pool.NewConns(pool.LocalDialer(map[string]pool.Client{"a": inproc.New(r, addr)}), pool.CircuitOptions{}, time.Now)
	defer conns.Close()
	cfg := pool.NewConfig("a", localBS, []string{"m"}, pool.LocalAddress("a"))
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := pool.Open(cfg, pool.Options{Conns: conns})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pr, toks := localPrompt(t, 7, 3)
	cache(t, r, "w1", toks)
	sel, err := p.Probe(context.Background(), pr)
	if err != nil || sel.WorkerID != "w1" || sel.Router != pool.LocalAddress("a") {
		t.Fatalf("pool probe = %+v, %v; want w1 via local:a", sel, err)
	}
	tr, got, err := p.Commit(context.Background(), sel.Router, pool.Commit{RequestID: "x", WorkerID: sel.WorkerID, Prompt: pr})
	if err != nil || got.WorkerID != "w1" {
		t.Fatalf("pool commit = %+v, %v", got, err)
	}
	if err := tr.Free(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Active().Has("x"); ok {
		t.Fatal("request x still on the router")
	}
}

// TestLocalConcurrent runs probes, loads, commits and frees at once (for
// the race detector) and checks every request ends freed.
func TestLocalConcurrent(t *testing.T) {
	r, addr := localRouter(t, 4)
	c := inproc.New(r, addr)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				p, toks := localPrompt(t, uint32(g*1000+i%5), 3)
				if i%7 == 0 {
					cache(t, r, fmt.Sprintf("w%d", i%4), toks)
				}
				if _, err := c.Probe(context.Background(), p); err != nil {
					t.Error(err)
					return
				}
				if _, err := c.Loads(context.Background(), p); err != nil {
					t.Error(err)
					return
				}
				done := make(chan struct{})
				tr, err := c.CommitAsync(context.Background(), pool.Commit{RequestID: fmt.Sprintf("g%d-%d", g, i), Prompt: p},
					func(_ routing.Selection, err error) {
						if err != nil {
							t.Error(err)
						}
						close(done)
					})
				if err != nil {
					t.Error(err)
					return
				}
				<-done
				_ = tr.PrefillComplete(context.Background())
				_ = tr.Free(context.Background())
			}
		})
	}
	wg.Wait()
	n := 0
	r.Active().Loads(func(localrouter.WorkerKey, localrouter.WorkerLoad) { n++ })
	if n != 0 {
		t.Fatalf("%d workers still have requests", n)
	}
}

// TestReservations: a probe carrying ReserveID reserves (the next probe
// of the same prompt goes elsewhere), a commit with Reserved confirms it
// on the reserved worker, Release drops another, and Close releases the
// ones left, as a broken stream does.
func TestReservations(t *testing.T) {
	r, addr := localRouter(t, 2)
	c := inproc.New(r, addr)
	ctx := context.Background()
	p, _ := localPrompt(t, 0, 16)
	reserve := func(id string) routing.Selection {
		t.Helper()
		q := p
		q.ReserveID, q.ReserveTTL = id, routing.MaxReserveTTL
		sel, err := c.Probe(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return sel
	}
	a, b := reserve("a"), reserve("b")
	if a.WorkerID == b.WorkerID {
		t.Errorf("two reserving probes of one prompt both chose %s", a.WorkerID)
	}
	tr, err := c.CommitAsync(ctx, pool.Commit{RequestID: "a", WorkerID: a.WorkerID, Prompt: p, Reserved: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	reserve("c")
	if rs := r.ReservationStats(); rs.Held != 1 || rs.Confirmed != 1 || rs.Released != 1 {
		t.Errorf("stats %+v, want c held, a confirmed, b released", rs)
	}
	if err := tr.Free(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if rs := r.ReservationStats(); rs.Held != 0 || rs.Released != 2 {
		t.Errorf("after Close %+v, want none held, c released", rs)
	}
	if n := r.Active().Stats().Requests; n != 0 {
		t.Errorf("%d requests left after Close", n)
	}
}

// TestReserveTTLBounded: the in-process client, trusted as it is, is held
// to the same reservation bound as the gRPC servers (routing.MaxReserveTTL,
// the router's own rule): a longer reservation is refused with
// ErrReserveTTL and holds nothing; at the bound it reserves.
func TestReserveTTLBounded(t *testing.T) {
	r, addr := localRouter(t, 2)
	c := inproc.New(r, addr)
	ctx := context.Background()
	p, _ := localPrompt(t, 0, 16)
	p.ReserveID, p.ReserveTTL = "long", routing.MaxReserveTTL+time.Microsecond
	if _, err := c.Probe(ctx, p); !errors.Is(err, routing.ErrReserveTTL) {
		t.Fatalf("reserving for %v: got %v, want routing.ErrReserveTTL", p.ReserveTTL, err)
	}
	if rs := r.ReservationStats(); rs.Held != 0 {
		t.Errorf("after the refused probe: %+v, want nothing held", rs)
	}
	p.ReserveID, p.ReserveTTL = "bounded", routing.MaxReserveTTL
	if _, err := c.Probe(ctx, p); err != nil {
		t.Fatalf("reserving for %v: %v", p.ReserveTTL, err)
	}
	if rs := r.ReservationStats(); rs.Held != 1 {
		t.Errorf("after a probe at the bound: %+v, want 1 held", rs)
	}
}
