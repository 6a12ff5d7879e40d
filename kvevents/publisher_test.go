package kvevents_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
)

// noLeaks checks, after every other cleanup of t, that no goroutine is
// left behind (the package has no TestMain of its own to hook goleak into).
func noLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func u64(v uint64) *uint64 { return &v }

// lh is the local hash a dump carries for a block of tokens.
func lh(tokens []uint32, lora string) *uint64 {
	return u64(kvevents.BlockHash(tokens, kvevents.LoRASeed(lora)))
}

// collector subscribes to a pool's events and applies them to per-worker
// block sets, as a router would.
type collector struct {
	ch chan kvevents.RouterEvent
}

func subscribe(t *testing.T, nc *nats.Conn, pool string) *collector {
	t.Helper()
	c := &collector{ch: make(chan kvevents.RouterEvent, 1024)}
	sub, err := nc.Subscribe(kvevents.EventsSubject(pool), func(m *nats.Msg) {
		e, err := kvevents.DecodeMsgpack(m.Data)
		if err != nil {
			t.Errorf("decode event: %v", err)
			return
		}
		c.ch <- e
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *collector) next(ctx context.Context, t *testing.T) kvevents.RouterEvent {
	t.Helper()
	select {
	case e := <-c.ch:
		return e
	case <-ctx.Done():
		t.Fatal("timed out waiting for an event")
		return kvevents.RouterEvent{}
	}
}

func TestPublisherEventsAndDump(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	reg := prometheus.NewRegistry()
	p, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: "a", WorkerID: "w1", Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub := subscribe(t, testenv.ConnectNATS(t, ns.ClientURL()), "a")

	steps := []struct {
		name string
		do   func() error
	}{
		{"root chain", func() error {
			return p.PublishStored([]uint32{1, 2, 3, 4, 5, 6}, 2, []uint64{10, 11, 12}, nil, "")
		}},
		{"branch under 11", func() error {
			return p.PublishStored([]uint32{7, 8}, 2, []uint64{20}, u64(11), "")
		}},
		{"lora root", func() error { return p.PublishStored([]uint32{9, 9}, 2, []uint64{30}, nil, "ad") }},
		{"evict leaf", func() error { return p.PublishRemoved([]uint64{12}) }},
		{"rank 1", func() error {
			_, err := p.Publish(1, kvevents.Event{Stored: &kvevents.Stored{Blocks: []kvevents.Block{{EngineHash: 40, TokenIDs: []uint32{4, 4}}}}})
			return err
		}},
	}
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		e := sub.next(ctx, t)
		wantID := uint64(i + 1)
		if e.DPRank == 1 {
			wantID = 1
		}
		if e.WorkerID != "w1" || e.EventID != wantID {
			t.Errorf("%s: got worker %q id %d, want w1 id %d", s.name, e.WorkerID, e.EventID, wantID)
		}
	}
	for _, bad := range []error{
		p.PublishStored([]uint32{1, 2, 3}, 2, []uint64{1, 2}, nil, ""),
		p.PublishStored(nil, 0, nil, nil, ""),
	} {
		if bad == nil {
			t.Error("malformed PublishStored returned nil error")
		}
	}
	if got := p.LastEventID(0); got != 4 {
		t.Errorf("LastEventID(0) = %d after refused events, want 4 (no id spent)", got)
	}

	dump, err := kvevents.RequestDump(ctx, nc, "a", "w1")
	if err != nil {
		t.Fatal(err)
	}
	want := kvevents.DumpReply{
		WorkerID: "w1",
		Ranks:    []kvevents.DumpRank{{DPRank: 0, LastEventID: 4, Blocks: 4}, {DPRank: 1, LastEventID: 1, Blocks: 1}},
		Events: []kvevents.RouterEvent{
			{WorkerID: "w1", EventID: 4, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: []kvevents.Block{
				{EngineHash: 10, LocalHash: lh([]uint32{1, 2}, "")}, {EngineHash: 11, LocalHash: lh([]uint32{3, 4}, "")}, {EngineHash: 20, LocalHash: lh([]uint32{7, 8}, "")},
			}}}},
			{WorkerID: "w1", EventID: 4, Event: kvevents.Event{Stored: &kvevents.Stored{LoRAName: "ad", Blocks: []kvevents.Block{{EngineHash: 30, LocalHash: lh([]uint32{9, 9}, "ad")}}}}},
			{WorkerID: "w1", DPRank: 1, EventID: 1, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: []kvevents.Block{{EngineHash: 40, LocalHash: lh([]uint32{4, 4}, "")}}}}},
		},
	}
	if diff := cmp.Diff(want, dump); diff != "" {
		t.Errorf("dump (-want +got):\n%s", diff)
	}

	if err := p.PublishCleared(); err != nil {
		t.Fatal(err)
	}
	if e := sub.next(ctx, t); !e.Event.Cleared || e.EventID != 5 {
		t.Errorf("got %+v, want cleared event 5", e)
	}
	if n := len(p.Blocks(0)); n != 0 {
		t.Errorf("blocks after clear = %d, want 0", n)
	}
	const wantMetrics = `
# HELP kvgate_publisher_events_total KV events published, by kind.
# TYPE kvgate_publisher_events_total counter
kvgate_publisher_events_total{kind="cleared"} 1
kvgate_publisher_events_total{kind="removed"} 1
kvgate_publisher_events_total{kind="stored"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantMetrics), "kvgate_publisher_events_total"); err != nil {
		t.Error(err)
	}

	p.Close()
	if err := p.PublishCleared(); !errors.Is(err, kvevents.ErrPublisherClosed) {
		t.Errorf("publish after close: %v, want ErrPublisherClosed", err)
	}
	if _, err := kvevents.RequestDump(ctx, nc, "a", "w1"); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("dump after close: %v, want no responders", err)
	}
}

func TestDumpChainsBranches(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := testenv.ConnectNATS(t, testenv.StartNATS(t))
	p, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: "a", WorkerID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// A tree: 1 → {2 → 3, 4}; and 6 whose parent 5 was evicted.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(p.PublishStored([]uint32{1, 2, 3}, 1, []uint64{1, 2, 3}, nil, ""))
	must(p.PublishStored([]uint32{4}, 1, []uint64{4}, u64(1), ""))
	must(p.PublishStored([]uint32{5, 6}, 1, []uint64{5, 6}, nil, ""))
	must(p.PublishRemoved([]uint64{5}))
	dump, err := kvevents.RequestDump(ctx, nc, "a", "w")
	if err != nil {
		t.Fatal(err)
	}
	type chain struct {
		Parent *uint64
		Hashes []uint64
	}
	var got []chain
	for _, e := range dump.Events {
		c := chain{Parent: e.Event.Stored.ParentHash}
		for _, b := range e.Event.Stored.Blocks {
			c.Hashes = append(c.Hashes, b.EngineHash)
		}
		got = append(got, c)
	}
	want := []chain{{nil, []uint64{1}}, {u64(1), []uint64{2, 3}}, {u64(1), []uint64{4}}, {u64(5), []uint64{6}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dump chains (-want +got):\n%s", diff)
	}
}

func FuzzDecodeDumpReply(f *testing.F) {
	good, err := kvevents.EncodeDumpReply(kvevents.DumpReply{WorkerID: "w", Ranks: []kvevents.DumpRank{{LastEventID: 3, Blocks: 1}},
		Events: []kvevents.RouterEvent{{WorkerID: "w", EventID: 3, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: []kvevents.Block{{EngineHash: 1, TokenIDs: []uint32{1}}}}}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{0x80})
	h := uint64(7)
	for _, page := range []kvevents.DumpReply{
		{WorkerID: "w", Ranks: []kvevents.DumpRank{{LastEventID: 3, Blocks: 2}}, Page: 0, Pages: 2, Snapshot: 9,
			Events: []kvevents.RouterEvent{{WorkerID: "w", EventID: 3, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: []kvevents.Block{{EngineHash: 1, LocalHash: &h}}}}}}},
		{WorkerID: "w", Page: 1, Pages: 2, Snapshot: 9,
			Events: []kvevents.RouterEvent{{WorkerID: "w", EventID: 3, Event: kvevents.Event{Stored: &kvevents.Stored{ParentHash: u64(1), Blocks: []kvevents.Block{{EngineHash: 2, LocalHash: &h}}}}}}},
		{WorkerID: "w", Page: 5, Pages: 2, Snapshot: 9}, // out of range
		{WorkerID: "w", Page: 1, Pages: 2, Ranks: []kvevents.DumpRank{{}}},
		{WorkerID: "w", Pages: kvevents.MaxDumpPages + 1},
	} {
		b, err := kvevents.EncodeDumpReply(page)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := kvevents.DecodeDumpReply(b)
		if err != nil {
			if !errors.Is(err, kvevents.ErrInvalidEvent) {
				t.Fatalf("error %v is not ErrInvalidEvent", err)
			}
			return
		}
		switch {
		case r.Pages < 0 || r.Pages > kvevents.MaxDumpPages:
			t.Fatalf("accepted %d pages", r.Pages)
		case r.Pages == 0 && (r.Page != 0 || r.Snapshot != 0):
			t.Fatalf("accepted page %d snapshot %d of an unpaged reply", r.Page, r.Snapshot)
		case r.Pages > 0 && (r.Page < 0 || r.Page >= r.Pages):
			t.Fatalf("accepted page %d of %d", r.Page, r.Pages)
		case r.Page > 0 && len(r.Ranks) > 0:
			t.Fatalf("accepted ranks on page %d", r.Page)
		}
		for _, e := range r.Events {
			if e.Event.Stored == nil || e.Validate() != nil {
				t.Fatalf("accepted a non-stored or invalid event %+v", e)
			}
		}
	})
}

// TestPublisherStaleWhileNATSDown (issue 13 item 5): a publisher whose
// connection stays down past StaleAfter reports the worker stale, and fresh
// again once NATS is back.
func TestPublisherStaleWhileNATSDown(t *testing.T) {
	ctx := testenv.Context(t)
	srv := testenv.StartRestartableNATS(t)
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	changes := make(chan bool, 16)
	pub, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{
		Pool: "p", WorkerID: "w1", StaleAfter: 100 * time.Millisecond,
		OnStale: func(stale bool) { changes <- stale },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.PublishCleared(); err != nil {
		t.Fatal(err)
	}
	want := func(stale bool) {
		t.Helper()
		select {
		case got := <-changes:
			if got != stale {
				t.Fatalf("OnStale(%v), want OnStale(%v)", got, stale)
			}
		case <-ctx.Done():
			t.Fatalf("no OnStale(%v)", stale)
		}
	}
	srv.Stop()
	want(true)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	want(false)
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-changes:
		t.Errorf("OnStale(%v) with nothing changed", got)
	default:
	}
}
