package mocker_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/mockerd"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/kvevents/relay"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
)

// indexBlocks returns the engine hashes the index holds for worker, and
// checks on the way that every block sits where its engine hash says: the
// mocker's engine hashes are kvgate sequence hashes, so chaining the
// index's local hashes along each dumped path must reproduce them.
func indexBlocks(t *testing.T, ix *localrouter.Index, worker string) map[uint64]struct{} {
	t.Helper()
	seqOf := map[uint64]uint64{} // engine hash → sequence hash along the index's path
	held := map[uint64]struct{}{}
	for _, e := range ix.Dump() {
		if e.WorkerID != worker {
			continue
		}
		switch {
		case e.Event.Stored != nil:
			parentSeq, hasParent := uint64(0), false
			if p := e.Event.Stored.ParentHash; p != nil {
				parentSeq, hasParent = seqOf[*p]
				if !hasParent {
					t.Fatalf("dump stores under unknown parent %x", *p)
				}
			}
			for _, b := range e.Event.Stored.Blocks {
				if b.LocalHash == nil {
					t.Fatalf("dumped block %x without a local hash", b.EngineHash)
				}
				seq := *b.LocalHash
				if hasParent {
					seq = kvevents.ChainHash(parentSeq, seq)
				}
				seqOf[b.EngineHash] = seq
				held[b.EngineHash] = struct{}{}
				parentSeq, hasParent = seq, true
			}
		case e.Event.Removed != nil:
			for _, h := range e.Event.Removed.EngineHashes {
				delete(held, h) // stand-ins for parents the worker lacks
			}
		}
	}
	for h := range held {
		if seqOf[h] != h {
			t.Errorf("block %x sits at sequence hash %x in the index", h, seqOf[h])
		}
	}
	return held
}

// TestMockerRelayIndexAgree runs the mocker in ZMQ mode, `kvgate relay`'s
// code path to NATS, and a local-router index fed from NATS. After a load
// with shared prefixes that overflows the cache (evictions, preemptions),
// the index's blocks for the worker equal the mocker's cache content.
func TestMockerRelayIndexAgree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	_, cli := testenv.StartEtcd(t)
	log := testenv.Logger(t)

	const bs = 4
	mctx, stopMocker := context.WithCancel(ctx)
	defer stopMocker()
	inst, err := mockerd.Start(mctx, mockerd.RunConfig{
		Server: mocker.ServerConfig{Model: "m", Engine: mocker.Config{
			BlockSize: bs, NumBlocks: 64, MaxNumSeqs: 8, MaxNumBatchedTokens: 64, Speedup: 200,
		}},
		Listen: "127.0.0.1:0", Pool: "p", Events: mockerd.EventsZMQ, ZMQEndpoint: "tcp://127.0.0.1:0",
		ZMQReplayEndpoint: "tcp://127.0.0.1:0",
	}, mockerd.RunDeps{Logger: log, Registry: prometheus.NewRegistry(), Etcd: cli})
	if err != nil {
		t.Fatal(err)
	}

	rctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	r, err := relay.New(relay.Config{Endpoints: []string{inst.ZMQEndpoint}, ReplayEndpoints: []string{inst.ZMQReplayEndpoint}, Topic: "kv-events", Pool: "p",
		Worker: membership.WorkerInfo{ID: inst.WorkerID, BlockSize: bs}},
		relay.Options{NATS: nc, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(rctx) }()

	ix, err := localrouter.NewIndex(bs, localrouter.IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cleared := make(chan struct{}, 1)
	var applyErrs sync.Map
	sub, err := testenv.ConnectNATS(t, ns.ClientURL()).Subscribe(kvevents.EventsSubject("p"), func(m *nats.Msg) {
		e, err := kvevents.DecodeMsgpack(m.Data)
		if err != nil {
			applyErrs.Store(fmt.Sprint("decode: ", err), true)
			return
		}
		if err := ix.Apply(e); err != nil {
			applyErrs.Store(fmt.Sprintf("apply event %d: %v", e.EventID, err), true)
		}
		if e.Event.Cleared {
			select {
			case cleared <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// The mocker registered itself.
	resp, err := cli.Get(ctx, membership.WorkersPrefix("p")+inst.WorkerID)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("mocker registration: %v %v", resp, err)
	}

	// A ZMQ subscriber misses what was published before it joined: reset
	// the (empty) prefix cache until the Cleared event comes through.
	base := "http://" + inst.Addr
	for joined := false; !joined; {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/reset_prefix_cache", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		select {
		case <-cleared:
			joined = true
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("relay never received the mocker's events")
		}
	}

	// Load: 6 system prompts shared by many requests, unique suffixes,
	// 8 concurrent clients; 64 blocks of 4 tokens cannot hold it all
	// (evictions and preemptions).
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				n := c*8 + i
				toks := make([]string, 0, 64)
				for k := range 24 + 4*(n%3) {
					toks = append(toks, fmt.Sprint(1000*(n%6)+k))
				}
				for k := range 5 + n%11 {
					toks = append(toks, fmt.Sprint(100000+100*n+k))
				}
				body := fmt.Sprintf(`{"model":"m","prompt":[%s],"max_tokens":%d}`, strings.Join(toks, ","), 8+n%29)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("request %d: status %d", n, resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := inst.Server.Stats()
	if st.PrefixHitTokens == 0 {
		t.Errorf("no prefix hits: %+v", st)
	}
	t.Logf("mocker stats: %+v", st)

	// Events are asynchronous: wait until the index has caught up, then
	// compare the sets.
	want := inst.Server.CachedBlocks()
	var got map[uint64]struct{}
	for {
		got = indexBlocks(t, ix, inst.WorkerID)
		if maps.Equal(want, got) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("index never matched the mocker's cache:\n%s", cmp.Diff(sorted(want), sorted(got)))
		case <-time.After(20 * time.Millisecond):
		}
	}
	if len(want) == 0 {
		t.Error("mocker cache is empty: the test proves nothing")
	}
	applyErrs.Range(func(k, _ any) bool {
		t.Errorf("index: %v", k)
		return true
	})
	if st.EvictedBlocks == 0 {
		t.Errorf("no evictions: the load was too light (%+v)", st)
	}

	stopRelay()
	if err := <-relayDone; err != nil {
		t.Errorf("relay: %v", err)
	}
	stopMocker()
	if err := inst.Wait(); err != nil {
		t.Errorf("mocker: %v", err)
	}
	if resp, err := cli.Get(ctx, membership.WorkersPrefix("p")+inst.WorkerID); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("mocker still registered after shutdown: %v %v", resp, err)
	}
}

func sorted(m map[uint64]struct{}) []uint64 {
	return slices.Sorted(maps.Keys(m))
}

// TestMockerNATSModeDump runs the mocker publishing straight to NATS and
// checks that a dump request returns exactly its cache content.
func TestMockerNATSModeDump(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := testenv.ConnectNATS(t, testenv.StartNATS(t))
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	inst, err := mockerd.Start(mctx, mockerd.RunConfig{
		Server: mocker.ServerConfig{Engine: mocker.Config{BlockSize: 4, NumBlocks: 32, Speedup: 500}},
		Listen: "127.0.0.1:0", Pool: "p", WorkerID: "w9", Events: mockerd.EventsNATS,
	}, mockerd.RunDeps{Logger: testenv.Logger(t), Registry: prometheus.NewRegistry(), NATS: nc})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		body := fmt.Sprintf(`{"prompt":"shared system prompt words here then question %d about things","max_tokens":%d}`, i, 3+i)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+inst.Addr+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	want := inst.Server.CachedBlocks()
	for {
		dump, err := kvevents.RequestDump(ctx, nc, "p", "w9")
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint64]struct{}{}
		for _, e := range dump.Events {
			for _, b := range e.Event.Stored.Blocks {
				got[b.EngineHash] = struct{}{}
			}
		}
		if maps.Equal(want, got) {
			if len(dump.Ranks) != 1 || dump.Ranks[0].LastEventID == 0 {
				t.Errorf("dump ranks %+v", dump.Ranks)
			}
			// A router rebuilding from the dump (local hashes, no tokens)
			// puts every block where the engine has it.
			ix, err := localrouter.NewIndex(4, localrouter.IndexOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range dump.Events {
				if err := ix.Apply(e); err != nil {
					t.Errorf("apply dumped event: %v", err)
				}
			}
			if diff := cmp.Diff(sorted(want), sorted(indexBlocks(t, ix, "w9"))); diff != "" {
				t.Errorf("index rebuilt from the dump (-cache +index):\n%s", diff)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("dump never matched the cache:\n%s", cmp.Diff(sorted(want), sorted(got)))
		case <-time.After(20 * time.Millisecond):
		}
	}
	if inst.Server.Stats().EvictedBlocks == 0 {
		t.Error("no evictions: the dump test should cover removals")
	}
	stop()
	if err := inst.Wait(); err != nil {
		t.Error(err)
	}
}
