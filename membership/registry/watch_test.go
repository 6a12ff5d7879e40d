package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
)

const timeout = 30 * time.Second

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder is a Handler that records its calls.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) WorkerUp(info membership.WorkerInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("up %s %s", info.ID, info.Address))
}

func (r *recorder) WorkerDown(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "down "+id)
}

func (r *recorder) wait(t *testing.T, want ...string) {
	t.Helper()
	testenv.Eventually(t, timeout, func() (string, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if diff := cmp.Diff(want, r.calls); diff != "" {
			return "calls (-want +got):\n" + diff, false
		}
		return "", true
	})
}

func put(t *testing.T, cli *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := cli.Put(ctx, key, value); err != nil {
		t.Fatal(err)
	}
}

func info(id, addr string) string {
	b, _ := json.Marshal(membership.WorkerInfo{ID: id, Address: addr, DPSize: 1, BlockSize: 16})
	return string(b)
}

func TestWatcher(t *testing.T) {
	t.Parallel() // its own etcd: nothing shared
	_, cli := testenv.StartEtcd(t)
	prefix := membership.WorkersPrefix("p")
	put(t, cli, prefix+"w1", info("w1", "a:1"))
	put(t, cli, membership.WorkersPrefix("other")+"x", info("x", "x:1")) // another pool
	rec := &recorder{}
	w := registry.NewWatcher(cli, "p", rec, registry.WatcherOptions{BlockSize: 16, Logger: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-w.Synced():
	case <-time.After(timeout):
		t.Fatal("not synced")
	}
	rec.wait(t, "up w1 a:1")

	put(t, cli, prefix+"w2", info("w2", "b:1"))
	put(t, cli, prefix+"w2", info("w2", "b:1")) // unchanged: no call
	put(t, cli, prefix+"w1", info("w1", "a:2")) // moved
	put(t, cli, prefix+"w3", `{"id":"w3"}`)     // invalid: ignored
	put(t, cli, prefix+"w4", info("w5", "c:1")) // id differs from key: ignored
	b, _ := json.Marshal(membership.WorkerInfo{ID: "w6", Address: "d:1", DPSize: 1, BlockSize: 32})
	put(t, cli, prefix+"w6", string(b))         // other block size: ignored
	put(t, cli, prefix+"w2", `not json`)        // became invalid: gone
	put(t, cli, prefix+"w1", info("w1", "a:2")) // unchanged
	ctx2, cancel2 := context.WithTimeout(context.Background(), timeout)
	defer cancel2()
	if _, err := cli.Delete(ctx2, prefix+"w1"); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "up w1 a:1", "up w2 b:1", "up w1 a:2", "down w2", "down w1")
	if got := w.Workers(); len(got) != 0 {
		t.Errorf("Workers() = %v, want none", got)
	}
}

func TestRouterRegistrationSurvivesLeaseLoss(t *testing.T) {
	t.Parallel() // its own etcd: nothing shared
	_, cli := testenv.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	key := membership.RouterKey("p", "r1")
	reg, err := registry.RegisterRouter(ctx, cli, membership.RouterInfo{ID: "r1", GRPCAddress: "h:1", Pool: "p", BlockSize: 16}, 2*time.Second, quiet)
	if err != nil {
		t.Fatal(err)
	}
	get := func() (clientv3.LeaseID, bool) {
		r, err := cli.Get(ctx, key)
		if err != nil || len(r.Kvs) == 0 {
			return 0, false
		}
		return clientv3.LeaseID(r.Kvs[0].Lease), true
	}
	lease, ok := get()
	if !ok {
		t.Fatal("not registered")
	}
	// Someone revokes the lease (or etcd lost it): the key goes, and comes
	// back under a new lease.
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, func() (string, bool) {
		l, ok := get()
		return fmt.Sprintf("lease %x present %v", l, ok), ok && l != lease
	})
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(); ok {
		t.Error("key still there after Close")
	}
	if err := reg.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
