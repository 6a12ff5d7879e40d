package events_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/events"
)

// TestResyncAfterReconnect (issue 13 item 5): NATS restarts; an event the
// worker published while it was down is lost, and the worker then stays
// idle. The router, once reconnected, asks it for a dump and its index part
// is right again without waiting for a next event to reveal the gap.
func TestResyncAfterReconnect(t *testing.T) {
	ctx := testenv.Context(t)
	srv := testenv.StartRestartableNATS(t)
	connect := func(opts ...nats.Option) *nats.Conn {
		nc, err := nats.Connect(srv.URL(), append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	routerNC := connect()
	// No reconnect buffer: a publish while NATS is down fails (its id is
	// spent), as one past a full buffer would.
	workerNC := connect(nats.ReconnectBufSize(-1))

	r, err := localrouter.New(localrouter.DefaultConfig(), localrouter.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.AddWorker("w1", 1)
	sub, err := events.New(routerNC, r, events.Options{
		Pool: "p", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		DumpTimeout: 2 * time.Second, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub, err := kvevents.NewPublisher(workerNC, kvevents.PublisherConfig{Pool: "p", WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.PublishStored(tokens(0, 64), 16, []uint64{1, 2, 3, 4}, nil, ""); err != nil {
		t.Fatal(err)
	}
	if err := workerNC.Flush(); err != nil {
		t.Fatal(err)
	}
	sub.WorkerUp("w1")
	waitTree(t, r, "w1", 4)
	testenv.Eventually(t, timeout, func() (string, bool) { return "not synced", sub.Synced("w1") })
	dumps := sub.Stats().Dumps

	srv.Stop()
	testenv.Eventually(t, timeout, func() (string, bool) { return "worker still connected", !workerNC.IsConnected() })
	if err := pub.PublishRemoved([]uint64{3, 4}); err == nil {
		t.Fatal("publish while NATS is down: nil error, want one (no reconnect buffer)")
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitTree(t, r, "w1", 2)
	st := sub.Stats()
	if st.Reconnects < 1 || st.Dumps <= dumps {
		t.Errorf("stats %+v: want a reconnection and a dump after it (had %d dumps)", st, dumps)
	}
}
