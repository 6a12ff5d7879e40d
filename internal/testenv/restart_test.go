package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestRestartable: etcd keeps its data and endpoint across a restart, and a
// NATS client reconnects to the restarted server on the same URL.
func TestRestartable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := StartRestartableEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	before := e.Endpoints()
	e.Stop()
	if err := e.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.Endpoints(); got[0] != before[0] {
		t.Errorf("endpoints %v after restart, want %v", got, before)
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get after restart: %v %v, want v", resp, err)
	}
	fresh, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	defer gcancel()
	if resp, err := fresh.Get(gctx, "k"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("a new client after the restart: %v %v", resp, err)
	}

	n := StartRestartableNATS(t)
	nc, err := nats.Connect(n.URL(), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	n.Stop()
	if err := n.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, func() (string, bool) {
		if !nc.IsConnected() {
			return "nats client not reconnected", false
		}
		return "", true
	})
}
