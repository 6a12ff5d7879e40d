package mocker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/mockerd"
	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
)

// TestStaleWhileNATSDown (issue 13 item 5): a mocker publishing over NATS
// marks its etcd registration stale once NATS has been down for
// StaleAfter, keeping the key (and its lease), and clears the mark when
// NATS is back.
func TestStaleWhileNATSDown(t *testing.T) {
	ctx := testenv.Context(t)
	srv := testenv.StartRestartableNATS(t)
	nc, err := (runner.NATS{URL: srv.URL()}).Connect("test-mocker", testenv.Logger(t), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, cli := testenv.StartEtcd(t)
	mctx, stop := context.WithCancel(ctx)
	inst, err := mockerd.Start(mctx, mockerd.RunConfig{
		Server: mocker.ServerConfig{Engine: mocker.Config{BlockSize: 4, NumBlocks: 32, Speedup: 500}},
		Listen: "127.0.0.1:0", Pool: "p", WorkerID: "w1", Events: mockerd.EventsNATS,
		StaleAfter: 100 * time.Millisecond, LeaseTTL: 5 * time.Second,
	}, mockerd.RunDeps{Logger: testenv.Logger(t), Registry: prometheus.NewRegistry(), NATS: nc, Etcd: cli})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		stop()
		if err := inst.Wait(); err != nil {
			t.Error(err)
		}
	}()
	key := membership.WorkerKey("p", "w1")
	record := func() (membership.WorkerInfo, int64, error) {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return membership.WorkerInfo{}, 0, err
		}
		if len(resp.Kvs) != 1 {
			return membership.WorkerInfo{}, 0, fmt.Errorf("%s: %d keys", key, len(resp.Kvs))
		}
		info, err := membership.ParseWorkerInfo(resp.Kvs[0].Value)
		return info, resp.Kvs[0].Lease, err
	}
	waitStale := func(want bool) int64 {
		t.Helper()
		var lease int64
		testenv.Eventually(t, 30*time.Second, func() (string, bool) {
			info, l, err := record()
			lease = l
			return fmt.Sprintf("record %+v (%v), want stale=%v", info, err, want), err == nil && info.Stale == want
		})
		return lease
	}
	lease := waitStale(false)
	srv.Stop()
	if got := waitStale(true); got != lease {
		t.Errorf("stale record under lease %x, want the registration's %x", got, lease)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitStale(false)
}
