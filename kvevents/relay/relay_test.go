package relay_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/kvevents/relay"
	"github.com/kvgate/kvgate/membership"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", name+".msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantEvents(t *testing.T, name string) []kvevents.Event {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var w struct {
		Events []kvevents.Event `json:"events"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		t.Fatal(err)
	}
	return w.Events
}

// TestRelayEndToEnd runs a relay between a ZMQ PUB socket speaking vLLM's
// format (python3-msgpack fixtures) and NATS, with etcd registration:
// events arrive in order with kvgate ids, malformed messages are counted
// and skipped, the worker is registered while the relay runs and gone when
// it stops.
func TestRelayEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	_, cli := testenv.StartEtcd(t)

	pub := listenPub(ctx, t)
	endpoint := "tcp://" + pub.Addr().String()

	events := make(chan kvevents.RouterEvent, 256)
	sub, err := testenv.ConnectNATS(t, ns.ClientURL()).Subscribe(kvevents.EventsSubject("p"), func(m *nats.Msg) {
		e, err := kvevents.DecodeMsgpack(m.Data)
		if err != nil {
			t.Errorf("decode: %v", err)
			return
		}
		events <- e
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	reg := prometheus.NewRegistry()
	info := membership.WorkerInfo{ID: "w1", Address: "10.0.0.7:8000", BlockSize: 4, Model: "m"}
	r, err := relay.New(relay.Config{Endpoints: []string{endpoint}, Topic: "kv", Pool: "p", Worker: info, Register: true, LeaseTTL: 5 * time.Second},
		relay.Options{NATS: nc, Etcd: cli, Registerer: reg, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(ctx, r)

	key := membership.WorkersPrefix("p") + "w1"
	waitKey(ctx, t, cli, key, true)

	next := func() kvevents.RouterEvent { t.Helper(); return nextEvent(ctx, t, events) }
	// ZMQ drops what a PUB sends before the subscription reaches it:
	// send AllBlocksCleared until one comes through.
	seq := uint64(0)
	clearedPayload, err := kvevents.EncodeEnginePayload(0, []kvevents.Event{{Cleared: true}}, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	for joined := false; !joined; {
		seq++
		if err := pub.Send(zmq4.NewMsgFrom(kvevents.EngineFrames("kv", seq, clearedPayload)...)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-events:
			joined = true
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("relay never joined")
		}
	}
	// A marker ends the joining noise: events after it are the test's.
	marker, err := kvevents.EncodeEnginePayload(0, []kvevents.Event{{Stored: &kvevents.Stored{
		Blocks: []kvevents.Block{{EngineHash: 0xfeed, TokenIDs: []uint32{1, 2, 3, 4}}}}}}, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	seq++
	if err := pub.Send(zmq4.NewMsgFrom(kvevents.EngineFrames("kv", seq, marker)...)); err != nil {
		t.Fatal(err)
	}
	var lastID uint64
	for {
		e := next()
		if e.Event.Stored != nil && e.Event.Stored.Blocks[0].EngineHash == 0xfeed {
			lastID = e.EventID
			break
		}
	}

	send := func(frames ...[]byte) {
		t.Helper()
		if err := pub.Send(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	var want []kvevents.Event
	malformed := 0
	for _, name := range []string{"vllm_array_batch", "bad_not_msgpack", "vllm_bytes_hashes", "bad_trailing", "vllm_mixed_validity"} {
		if strings.HasPrefix(name, "bad_") {
			malformed++
			seq++
			send(kvevents.EngineFrames("kv", seq, fixture(t, name))...)
			continue
		}
		seq++
		send(kvevents.EngineFrames("kv", seq, fixture(t, name))...)
		want = append(want, wantEvents(t, name)...)
	}
	malformed++
	send([]byte("kv"), []byte("short")) // two frames
	// A last good message: once it arrives everything before was handled.
	seq++
	send(kvevents.EngineFrames("kv", seq, clearedPayload)...)
	want = append(want, kvevents.Event{Cleared: true})

	var got []kvevents.Event
	for i := range want {
		e := next()
		if e.WorkerID != "w1" || e.EventID != lastID+uint64(i)+1 {
			t.Errorf("event %d: worker %q id %d, want w1 id %d", i, e.WorkerID, e.EventID, lastID+uint64(i)+1)
		}
		got = append(got, e.Event)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("relayed events (-want +got):\n%s", diff)
	}
	if n := counterValue(t, reg, "kvgate_relay_malformed_messages_total"); int(n) != malformed {
		t.Errorf("malformed counter = %v, want %d", n, malformed)
	}
	// vllm_mixed_validity: 3 malformed events, an unknown type, an unknown
	// medium; its good events were relayed above.
	if n := counterValue(t, reg, "kvgate_relay_skipped_events_total"); n != 5 {
		t.Errorf("skipped events counter = %v, want 5", n)
	}

	// The engine restarts: its sequence starts over, its cache is empty.
	send(kvevents.EngineFrames("kv", 0, fixture(t, "sglang_new_dp"))...)
	if e := next(); !e.Event.Cleared || e.DPRank != 0 {
		t.Errorf("after a sequence reset got %+v, want a Cleared event for rank 0", e)
	}
	if e := next(); e.DPRank != 2 || e.EventID != 1 || e.Event.Stored == nil {
		t.Errorf("first event of rank 2 = %+v, want stored with id 1", e)
	}
	if n := counterValue(t, reg, "kvgate_relay_engine_restarts_total"); n != 1 {
		t.Errorf("restarts counter = %v, want 1", n)
	}

	// Messages lost for good (no replay socket): the worker's ranks are
	// cleared before the next message, so routers underestimate its cache
	// instead of drifting from it.
	// (The payload itself clears rank 0 only: rank 2's Cleared can come
	// only from the relay. The restart fixture's stores may come first.)
	send(kvevents.EngineFrames("kv", 5, clearedPayload)...)
	cleared := map[uint32]bool{}
	for !cleared[2] {
		e := next()
		switch {
		case e.Event.Cleared:
			cleared[e.DPRank] = true
		case len(cleared) > 0:
			t.Fatalf("after lost messages got %+v between Cleared events", e)
		}
	}
	if n := counterValue(t, reg, "kvgate_relay_sequence_gaps_total"); n != 1 {
		t.Errorf("gaps counter = %v, want 1", n)
	}

	// A malformed first message after a restart still shows the restart
	// by its sequence number.
	send(kvevents.EngineFrames("kv", 1, []byte{0xc1})...)
	cleared = map[uint32]bool{}
	for len(cleared) < 2 {
		e := next()
		if !e.Event.Cleared {
			t.Fatalf("after a malformed restart message got %+v, want Cleared for ranks 0 and 2", e)
		}
		cleared[e.DPRank] = true
	}

	if err := stop(); err != nil {
		t.Errorf("Run returned %v, want nil on cancellation", err)
	}
	waitKey(ctx, t, cli, key, false)
}

// nextEvent returns the next relayed event, failing the test when ctx ends
// first.
func nextEvent(ctx context.Context, t *testing.T, ch <-chan kvevents.RouterEvent) kvevents.RouterEvent {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-ctx.Done():
		t.Fatal("timed out waiting for a relayed event")
		return kvevents.RouterEvent{}
	}
}

// counterValue sums the samples of a counter family in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func waitKey(ctx context.Context, t *testing.T, cli *clientv3.Client, key string, present bool) {
	t.Helper()
	testenv.WaitWorkerKey(ctx, t, cli, key, present, "10.0.0.7:8000")
}

// TestRelayDataParallelEndpoints relays two ranks' sockets (vLLM binds one
// per data-parallel rank) as one worker, whose dump covers both ranks.
func TestRelayDataParallelEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	var pubs []zmq4.Socket
	var endpoints []string
	for range 2 {
		pub := zmq4.NewPub(ctx)
		defer pub.Close()
		if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, pub)
		endpoints = append(endpoints, "tcp://"+pub.Addr().String())
	}
	seen := subscribeEvents(t, ns.ClientURL(), "p", 256)
	r, err := relay.New(relay.Config{Endpoints: endpoints, Pool: "p", Worker: membership.WorkerInfo{ID: "w", BlockSize: 2, DPSize: 2}},
		relay.Options{NATS: nc, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(ctx, r)

	// Each rank stores one block, resent until it comes through (ZMQ drops
	// what a PUB sends before the subscription reaches it).
	for rank, pub := range pubs {
		payload, err := kvevents.EncodeEnginePayload(0, []kvevents.Event{{Stored: &kvevents.Stored{
			Blocks: []kvevents.Block{{EngineHash: uint64(100 + rank), TokenIDs: []uint32{1, 2}}}}}}, uint32(rank), 2)
		if err != nil {
			t.Fatal(err)
		}
		for seq, got := uint64(0), false; !got; seq++ {
			if err := pub.Send(zmq4.NewMsgFrom(kvevents.EngineFrames("", seq, payload)...)); err != nil {
				t.Fatal(err)
			}
			select {
			case e := <-seen:
				got = e.DPRank == uint32(rank)
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("rank %d never relayed", rank)
			}
		}
	}
	dump, err := kvevents.RequestDump(ctx, nc, "p", "w")
	if err != nil {
		t.Fatal(err)
	}
	var ranks []uint32
	for _, rk := range dump.Ranks {
		if rk.Blocks != 1 {
			t.Errorf("rank %d holds %d blocks, want 1", rk.DPRank, rk.Blocks)
		}
		ranks = append(ranks, rk.DPRank)
	}
	if diff := cmp.Diff([]uint32{0, 1}, ranks); diff != "" {
		t.Errorf("dumped ranks (-want +got):\n%s", diff)
	}
	if err := stop(); err != nil {
		t.Error(err)
	}
}

// TestRelayRecoversGapFromReplay plays vLLM's replay socket (a ROUTER
// answering [id, "", start_seq] with [id, "", seq, payload]… then END_SEQ):
// a batch the PUB socket lost is fetched and published in order.
func TestRelayRecoversGapFromReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	pub := listenPub(ctx, t)
	router := zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	stored := func(h uint64) []byte {
		p, err := kvevents.EncodeEnginePayload(0, []kvevents.Event{{Stored: &kvevents.Stored{
			Blocks: []kvevents.Block{{EngineHash: h, TokenIDs: []uint32{uint32(h), 0}}}}}}, 0, 2)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	var mu sync.Mutex
	buffer := map[uint64][]byte{} // what the engine published, by sequence
	requests := make(chan uint64, 4)
	routerDone := make(chan struct{})
	go func() {
		defer close(routerDone)
		for {
			msg, err := router.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				t.Errorf("replay request frames %q", msg.Frames)
				continue
			}
			start := binary.BigEndian.Uint64(msg.Frames[2])
			requests <- start
			mu.Lock()
			for seq := start; buffer[seq] != nil; seq++ {
				router.Send(zmq4.NewMsgFrom(msg.Frames[0], []byte{}, kvevents.EngineFrames("", seq, nil)[1], buffer[seq]))
			}
			mu.Unlock()
			router.Send(zmq4.NewMsgFrom(msg.Frames[0], []byte{}, bytes.Repeat([]byte{0xff}, 8), []byte{}))
		}
	}()
	publish := func(seq uint64, payload []byte, send bool) {
		t.Helper()
		mu.Lock()
		buffer[seq] = payload
		mu.Unlock()
		if send {
			if err := pub.Send(zmq4.NewMsgFrom(kvevents.EngineFrames("", seq, payload)...)); err != nil {
				t.Fatal(err)
			}
		}
	}

	seen := subscribeEvents(t, ns.ClientURL(), "p", 256)
	reg := prometheus.NewRegistry()
	r, err := relay.New(relay.Config{
		Endpoints: []string{"tcp://" + pub.Addr().String()}, ReplayEndpoints: []string{"tcp://" + router.Addr().String()},
		Pool: "p", Worker: membership.WorkerInfo{ID: "w", BlockSize: 2},
	}, relay.Options{NATS: nc, Logger: testenv.Logger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(ctx, r)

	next := func() kvevents.RouterEvent { t.Helper(); return nextEvent(ctx, t, seen) }
	// Join: resend block 1 under fresh sequences until it comes through
	// (earlier ones are lost before the subscription, with no gap: the
	// relay has no previous sequence yet).
	seq := uint64(0)
	for got := false; !got; seq++ {
		publish(seq, stored(1), true)
		select {
		case <-seen:
			got = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	// A marker block 7 ends the joining duplicates.
	publish(seq, stored(7), true)
	seq++
	for e := next(); e.Event.Stored.Blocks[0].EngineHash != 7; e = next() {
	}
	// Block 2 is lost on the PUB socket; block 3 arrives.
	publish(seq, stored(2), false)
	publish(seq+1, stored(3), true)
	for _, want := range []uint64{2, 3} {
		if e := next(); e.Event.Stored == nil || e.Event.Stored.Blocks[0].EngineHash != want {
			t.Fatalf("got %+v, want stored block %d", e, want)
		}
	}
	if got := <-requests; got != seq {
		t.Errorf("replay asked from %d, want %d", got, seq)
	}
	if n := counterValue(t, reg, "kvgate_relay_sequence_gaps_total"); n != 0 {
		t.Errorf("gaps = %v, want 0 (recovered)", n)
	}
	if n := counterValue(t, reg, "kvgate_relay_replayed_messages_total"); n != 1 {
		t.Errorf("replayed = %v, want 1", n)
	}
	if err := stop(); err != nil {
		t.Error(err)
	}
	router.Close()
	<-routerDone
}

// TestRelayEndpointErrorEndsRun: when one endpoint cannot be dialled, Run
// returns its error (and stops the other receivers) instead of hanging on
// with nothing relayed.
func TestRelayEndpointErrorEndsRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	pub := listenPub(ctx, t)
	r, err := relay.New(relay.Config{Endpoints: []string{"tcp://" + pub.Addr().String(), "bogus://nowhere"}, Pool: "p",
		Worker: membership.WorkerInfo{ID: "w", BlockSize: 2, DPSize: 2}}, relay.Options{NATS: nc, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Run with an endpoint that cannot be dialled returned nil")
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after an endpoint failed")
	}
}

// listenPub binds an engine's ZMQ PUB socket on a free loopback port,
// closed when the test ends.
func listenPub(ctx context.Context, t *testing.T) zmq4.Socket {
	t.Helper()
	pub := zmq4.NewPub(ctx)
	t.Cleanup(func() { pub.Close() })
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return pub
}

// subscribeEvents receives the router events published on NATS at url for
// pool (buffering n; what does not decode is dropped) until the test ends.
func subscribeEvents(t *testing.T, url, pool string, n int) <-chan kvevents.RouterEvent {
	t.Helper()
	events := make(chan kvevents.RouterEvent, n)
	sub, err := testenv.ConnectNATS(t, url).Subscribe(kvevents.EventsSubject(pool), func(m *nats.Msg) {
		if e, err := kvevents.DecodeMsgpack(m.Data); err == nil {
			events <- e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return events
}

// runRelay runs r until ctx ends or stop is called; stop waits for Run and
// returns its error.
func runRelay(ctx context.Context, r *relay.Relay) (stop func() error) {
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	return func() error { cancel(); return <-done }
}
