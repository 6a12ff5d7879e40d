package mocker_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/mockerd"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/kvevents/relay"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
)

// TestZMQDataParallel: a DP=2 mocker binds one ZMQ PUB socket per rank, as
// vLLM does; `kvgate relay` given both endpoints republishes each rank's
// events under its rank, and a request routed to rank 1 stores blocks on
// rank 1 only.
func TestZMQDataParallel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testenv.StartNATSServer(t)
	nc := testenv.ConnectNATS(t, ns.ClientURL())
	log := testenv.Logger(t)
	mctx, stopMocker := context.WithCancel(ctx)
	defer stopMocker()
	inst, err := mockerd.Start(mctx, mockerd.RunConfig{
		Server: mocker.ServerConfig{Model: "m", DPSize: 2, Engine: mocker.Config{BlockSize: 4, NumBlocks: 64, Speedup: 200}},
		Listen: "127.0.0.1:0", Pool: "p", Events: mockerd.EventsZMQ, ZMQEndpoint: "tcp://127.0.0.1:0",
	}, mockerd.RunDeps{Logger: log, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if len(inst.ZMQEndpoints) != 2 || inst.ZMQEndpoints[0] == inst.ZMQEndpoints[1] {
		t.Fatalf("ZMQ endpoints %v, want one per rank", inst.ZMQEndpoints)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	r, err := relay.New(relay.Config{Endpoints: inst.ZMQEndpoints, Topic: "kv-events", Pool: "p",
		Worker: membership.WorkerInfo{ID: inst.WorkerID, BlockSize: 4, DPSize: 2}},
		relay.Options{NATS: nc, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(rctx) }()
	defer func() { stopRelay(); <-relayDone }()

	var mu sync.Mutex
	cleared, stored := map[uint32]bool{}, map[uint32]int{}
	sub, err := testenv.ConnectNATS(t, ns.ClientURL()).Subscribe(kvevents.EventsSubject("p"), func(m *nats.Msg) {
		e, err := kvevents.DecodeMsgpack(m.Data)
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if e.Event.Cleared {
			cleared[e.DPRank] = true
		}
		if e.Event.Stored != nil {
			stored[e.DPRank]++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	base := "http://" + inst.Addr
	// A ZMQ subscriber misses what came before it joined: reset until both
	// ranks' Cleared events come through.
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/reset_prefix_cache", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		return "Cleared never came from both ranks", cleared[0] && cleared[1]
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13],"max_tokens":2}`))
	req.Header.Set("X-Data-Parallel-Rank", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(mocker.HeaderServedDPRank) != "1" {
		t.Fatalf("status %d, served by rank %q; want 200 from rank 1", resp.StatusCode, resp.Header.Get(mocker.HeaderServedDPRank))
	}
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		return "no Stored event from rank 1", stored[1] > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if stored[0] != 0 {
		t.Errorf("rank 0 published %d Stored events for a request rank 1 served", stored[0])
	}
}

func TestZMQEndpointOffsetRefusesBadEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := mockerd.Start(ctx, mockerd.RunConfig{
		Server: mocker.ServerConfig{DPSize: 2}, Listen: "127.0.0.1:0", Events: mockerd.EventsZMQ, ZMQEndpoint: "ipc:///tmp/x",
	}, mockerd.RunDeps{Logger: testenv.Logger(t)})
	if err == nil || !strings.Contains(err.Error(), "tcp://host:port") {
		t.Errorf("Start with an ipc endpoint and 2 ranks: %v, want an error asking for tcp://host:port", err)
	}
}
