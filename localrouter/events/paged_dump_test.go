package events_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/events"
)

// smallPayloadSetup is setup on a NATS server whose max_payload is 64 KiB,
// so a worker of 20k blocks is dumped in many pages.
func smallPayloadSetup(t *testing.T, pool string, workers ...string) (*nats.Conn, *localrouter.Router, *events.Subscriber) {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(testenv.StartTimeout) {
		t.Fatal("embedded nats not ready")
	}
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	r, err := localrouter.New(localrouter.DefaultConfig(), localrouter.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	for _, w := range workers {
		r.AddWorker(w, 1)
	}
	sub, err := events.New(testenv.ConnectNATS(t, ns.ClientURL()), r, events.Options{
		Pool: pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		DumpTimeout: 20 * time.Second, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Error(err)
		}
	})
	return nc, r, sub
}

// indexHashes returns the engine hashes the index holds for worker.
func indexHashes(r *localrouter.Router, worker string) map[uint64]struct{} {
	held := map[uint64]struct{}{}
	for _, e := range r.Index().Dump() {
		if e.WorkerID != worker || e.Event.Stored == nil {
			continue
		}
		for _, b := range e.Event.Stored.Blocks {
			held[b.EngineHash] = struct{}{}
		}
	}
	return held
}

// storeChains publishes runs of 4 chains of 64 blocks (each run from the
// root), one event per chain (live events must fit the max payload), with
// engine hashes and tokens from base on.
func storeChains(t *testing.T, pub *kvevents.Publisher, base uint64, blocks int) {
	t.Helper()
	var parent *uint64
	for c := 0; c < blocks; c += 64 {
		hashes := make([]uint64, min(64, blocks-c))
		for i := range hashes {
			hashes[i] = base + uint64(c+i)
		}
		if c%256 == 0 {
			parent = nil // a new root every 4 chains
		}
		if err := pub.PublishStored(tokens(16*(int(base)+c), 16*len(hashes)), 16, hashes, parent, ""); err != nil {
			t.Fatal(err)
		}
		last := hashes[len(hashes)-1]
		parent = &last
	}
}

// A worker of 20k blocks is dumped in many pages and rebuilt exactly;
// events published while the dump is in flight are held and applied after
// it.
func TestPagedDumpRebuildsWorker(t *testing.T) {
	nc, r, sub := smallPayloadSetup(t, "p", "w1")
	pub, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: "p", WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	storeChains(t, pub, 1<<20, 20000)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sub.WorkerUp("w1")
	// Live events racing the dump: more blocks, and leaves evicted.
	storeChains(t, pub, 1<<24, 640)
	for i := 0; i < 20000; i += 1024 { // the leaf of a run of chains
		if err := pub.PublishRemoved([]uint64{1<<20 + uint64(i+255)}); err != nil {
			t.Fatal(err)
		}
	}
	want := pub.Blocks(0)
	waitTree(t, r, "w1", len(want))
	testenv.Eventually(t, timeout, func() (string, bool) { return "not synced", sub.Synced("w1") })
	if diff := cmp.Diff(slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(indexHashes(r, "w1")))); diff != "" {
		t.Errorf("index of w1 (-publisher +index):\n%s", diff)
	}
	if st := sub.Stats(); st.DumpErrors != 0 || st.Rejected != 0 {
		t.Errorf("stats %+v, want no failed dump and nothing rejected", st)
	}
}

// pagedResponder answers dump requests for worker in pages of one chain
// each, the way kvevents.Publisher pages, skipping page drop on the first
// answer only. It stands in for the publisher at the one seam it replaces.
func pagedResponder(t *testing.T, nc *nats.Conn, pool, worker string, lastID uint64, chains [][]uint64, drop int) *atomic.Int64 {
	t.Helper()
	var answers atomic.Int64
	sub, err := nc.Subscribe(kvevents.DumpSubject(pool, worker), func(m *nats.Msg) {
		n := answers.Add(1)
		blocks := 0
		for _, c := range chains {
			blocks += len(c)
		}
		for i, c := range chains {
			if n == 1 && i == drop {
				continue
			}
			page := kvevents.DumpReply{WorkerID: worker, Page: i, Pages: len(chains), Snapshot: uint64(n)}
			if i == 0 {
				page.Ranks = []kvevents.DumpRank{{LastEventID: lastID, Blocks: blocks}}
			}
			st := &kvevents.Stored{}
			for _, h := range c {
				st.Blocks = append(st.Blocks, kvevents.Block{EngineHash: h, LocalHash: &h})
			}
			page.Events = []kvevents.RouterEvent{{WorkerID: worker, EventID: lastID, Event: kvevents.Event{Stored: st}}}
			b, err := kvevents.EncodeDumpReply(page)
			if err != nil {
				t.Errorf("encode page: %v", err)
				return
			}
			if err := m.Respond(b); err != nil {
				t.Errorf("respond: %v", err)
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &answers
}

// A dump with a lost page is a failed dump: the subscriber follows the
// live stream, asks again with backoff, and rebuilds from the next whole
// answer.
func TestLostDumpPageIsRetried(t *testing.T) {
	nc, r, sub := setup(t, "l", "w1")
	chains := [][]uint64{{1, 2, 3}, {10, 11}, {20, 21, 22, 23}, {30}}
	answers := pagedResponder(t, nc, "l", "w1", 5, chains, 1)
	sub.WorkerUp("w1")
	testenv.Eventually(t, timeout, func() (string, bool) { return "not synced", sub.Synced("w1") })
	waitTree(t, r, "w1", 10)
	if st, n := sub.Stats(), answers.Load(); st.DumpErrors != 1 || st.Dumps != 1 || n != 2 {
		t.Errorf("stats %+v after %d answers, want one failed dump, then one applied", st, n)
	}
	// Live events after the dump's last id apply on top.
	publish(t, nc, "l", kvevents.RouterEvent{WorkerID: "w1", EventID: 5, Event: kvevents.Event{Cleared: true}})
	publish(t, nc, "l", kvevents.RouterEvent{WorkerID: "w1", EventID: 6, Event: kvevents.Event{Removed: &kvevents.Removed{EngineHashes: []uint64{30}}}})
	waitTree(t, r, "w1", 9)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := kvevents.RequestDump(ctx, nc, "l", "w1"); err != nil {
		t.Errorf("a third answer is whole, got %v", err)
	}
}
