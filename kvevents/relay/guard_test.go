package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/kvevents/relay"
	"github.com/kvgate/kvgate/membership"
)

// TestRelayConfigGuard: an SGLang engine left at its default page_size 1
// sends only blocks of one token; the relay skips them all, counts them
// by reason, and tells the routers (a skip notice naming the flag to fix)
// instead of going silent.
func TestRelayConfigGuard(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	pub := listenPub(ctx, t)
	events := subscribeEvents(t, ns.ClientURL(), "p", 16)
	reg := prometheus.NewRegistry()
	r, err := relay.New(relay.Config{Endpoints: []string{"tcp://" + pub.Addr().String()}, Pool: "p",
		Worker: membership.WorkerInfo{ID: "sg", BlockSize: 16}},
		relay.Options{NATS: nc, Registerer: reg, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(ctx, r)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	var notice *kvevents.SkipNotice
	for seq := uint64(1); notice == nil; seq++ {
		if err := pub.Send(zmq4.NewMsgFrom(kvevents.EngineFrames("", seq, fixture(t, "sglang_page_size_1"))...)); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-events:
			if e.Event.Skipped == nil {
				t.Fatalf("relayed %+v, want only a skip notice", e.Event)
			}
			notice = e.Event.Skipped
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no skip notice")
		}
	}
	if notice.Reason != "block_size" || notice.EngineBlockSize != 1 || notice.BlockSize != 16 {
		t.Errorf("notice %+v, want block_size 1 vs 16", notice)
	}
	if msg := notice.Message(); !strings.Contains(msg, "--page-size 16") {
		t.Errorf("notice message %q does not name SGLang's --page-size 16", msg)
	}
	if n := counterValue(t, reg, "kvgate_relay_skipped_events_total"); n < 2 {
		t.Errorf("skipped events = %v, want ≥ 2", n)
	}
}
