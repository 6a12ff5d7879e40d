package registry_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}

// TestRegistrationSurvivesLeaseLoss revokes the registration's lease behind
// its back (as an etcd outage longer than the TTL would): the worker
// registers again under a new lease.
func TestRegistrationSurvivesLeaseLoss(t *testing.T) {
	t.Parallel() // its own etcd: nothing shared
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, cli := testenv.StartEtcd(t)
	info := membership.WorkerInfo{ID: "w1", Address: "10.0.0.7:8000", BlockSize: 16}
	reg, err := registry.Register(ctx, cli, "p", info, 5*time.Second, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	key := membership.WorkersPrefix("p") + "w1"
	if reg.Key() != key {
		t.Errorf("Key() = %q, want %q", reg.Key(), key)
	}
	waitKey(ctx, t, cli, key, true)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	first := resp.Kvs[0].Lease
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(first)); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 && resp.Kvs[0].Lease != first {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("never registered again after the lease was lost")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	waitKey(ctx, t, cli, key, false)
}

func TestRegisterRejectsBadInfo(t *testing.T) {
	t.Parallel() // its own etcd: nothing shared
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, cli := testenv.StartEtcd(t)
	for _, info := range []membership.WorkerInfo{
		{ID: "a/b", Address: "x", BlockSize: 16},
		{ID: "w", BlockSize: 16},
		{ID: "w", Address: "x"},
	} {
		if _, err := registry.Register(ctx, cli, "p", info, 0, nil); err == nil {
			t.Errorf("Register(%+v) = nil error, want one", info)
		}
	}
}

// TestCloseAfterLeaseLoss: Close right after the lease was revoked behind
// the registration's back (whether or not it has registered again yet)
// succeeds and leaves no key behind.
func TestCloseAfterLeaseLoss(t *testing.T) {
	t.Parallel() // its own etcd: nothing shared
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, cli := testenv.StartEtcd(t)
	info := membership.WorkerInfo{ID: "w1", Address: "10.0.0.7:8000", BlockSize: 16}
	for range 5 {
		reg, err := registry.Register(ctx, cli, "p", info, 5*time.Second, testenv.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, reg.Key())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get %s: %v, %v", reg.Key(), resp, err)
		}
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
			t.Fatal(err)
		}
		if err := reg.Close(); err != nil {
			t.Errorf("Close after the lease was lost: %v, want nil", err)
		}
		waitKey(ctx, t, cli, reg.Key(), false)
	}
}

func waitKey(ctx context.Context, t *testing.T, cli *clientv3.Client, key string, present bool) {
	t.Helper()
	testenv.WaitWorkerKey(ctx, t, cli, key, present, "10.0.0.7:8000")
}
