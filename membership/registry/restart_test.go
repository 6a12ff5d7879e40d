package registry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
)

// downCounter is a Handler that records WorkerDown calls.
type downCounter struct {
	mu   sync.Mutex
	up   map[string]bool
	down []string
}

func (d *downCounter) WorkerUp(info membership.WorkerInfo) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.up[info.ID] = true
}

func (d *downCounter) WorkerDown(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = append(d.down, id)
	delete(d.up, id)
}

func (d *downCounter) state() (int, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.up), append([]string(nil), d.down...)
}

// TestLeasesSurviveEtcdRestart (issue 13 item 4): etcd is down for longer
// than the registrations' TTL (2 s) and restarted on the same data. Every
// registration re-arms its keep-alive on the lease it had (etcd renews
// leases when it comes back), so every key is there again under the same
// lease, and a watcher that followed the pool throughout never saw a worker
// leave (a router would have freed its in-flight requests).
func TestLeasesSurviveEtcdRestart(t *testing.T) {
	t.Parallel() // its own etcd: nothing shared
	ctx := testenv.ContextWithTimeout(t, 90*time.Second)
	e := testenv.StartRestartableEtcd(t)
	etcd := runner.Etcd{Endpoints: e.Endpoints()}
	regCli, err := etcd.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer regCli.Close()
	watchCli, err := etcd.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer watchCli.Close()

	h := &downCounter{up: map[string]bool{}}
	w := registry.NewWatcher(watchCli, "p", h, registry.WatcherOptions{Logger: testenv.Logger(t)})
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan error, 1)
	go func() { wdone <- w.Run(wctx) }()
	defer func() { wcancel(); <-wdone }()

	const n = 4
	const ttl = 2 * time.Second
	regs := make([]*registry.Registration, n)
	leases := map[string]int64{}
	for i := range regs {
		info := membership.WorkerInfo{ID: fmt.Sprintf("w%d", i), Address: "10.0.0.7:8000", BlockSize: 16}
		if regs[i], err = registry.Register(ctx, regCli, "p", info, ttl, testenv.Logger(t)); err != nil {
			t.Fatal(err)
		}
		leases[regs[i].Key()] = leaseOf(ctx, t, regCli, regs[i].Key())
	}
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		up, _ := h.state()
		return fmt.Sprintf("watcher sees %d of %d workers", up, n), up == n
	})

	e.Stop()
	time.Sleep(3 * ttl / 2) // the outage: longer than the TTL
	if err := e.Restart(ctx); err != nil {
		t.Fatal(err)
	}

	check, err := etcd.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := check.Get(gctx, membership.WorkersPrefix("p"), clientv3.WithPrefix())
		if err != nil {
			return fmt.Sprintf("get: %v", err), false
		}
		got := map[string]int64{}
		for _, kv := range resp.Kvs {
			got[string(kv.Key)] = kv.Lease
		}
		for key, lease := range leases {
			if got[key] != lease {
				return fmt.Sprintf("%s under lease %x, want the lease it had, %x (all: %v)", key, got[key], lease, got), false
			}
		}
		return "", true
	})
	// The keep-alives run again: the keys outlive several TTLs, under the
	// same leases.
	for range 3 {
		time.Sleep(ttl)
		for _, r := range regs {
			resp, err := check.Get(ctx, r.Key())
			if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != leases[r.Key()] {
				t.Fatalf("%s after the restart: %v, %v; want it under lease %x (not kept alive)", r.Key(), resp, err, leases[r.Key()])
			}
		}
	}
	if up, down := h.state(); up != n || len(down) > 0 {
		t.Errorf("the watcher saw workers leave over the outage: %v (%d up)", down, up)
	}
	for _, r := range regs {
		if err := r.Close(); err != nil {
			t.Errorf("close %s: %v", r.Key(), err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		up, _ := h.state()
		return fmt.Sprintf("%d workers left after Close", up), up == 0
	})
}

// TestCloseWhileEtcdDown: Close returns (with an error) when etcd cannot
// be reached, rather than hanging on the revoke.
func TestCloseWhileEtcdDown(t *testing.T) {
	t.Parallel() // its own etcd: nothing shared
	ctx := testenv.ContextWithTimeout(t, 60*time.Second)
	e := testenv.StartRestartableEtcd(t)
	cli, err := (runner.Etcd{Endpoints: e.Endpoints()}).Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	reg, err := registry.Register(ctx, cli, "p", membership.WorkerInfo{ID: "w", Address: "10.0.0.7:8000", BlockSize: 16}, 2*time.Second, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	e.Stop()
	done := make(chan error, 1)
	go func() { done <- reg.Close() }()
	select {
	case err := <-done:
		t.Logf("Close while etcd is down: %v", err)
	case <-ctx.Done():
		t.Fatal("Close hung while etcd was down")
	}
}

func leaseOf(ctx context.Context, t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v, %v", key, resp, err)
	}
	return resp.Kvs[0].Lease
}
