package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/kvevents/relay"
)

// TestRegistrationSurvivesLeaseLoss revokes the registration's lease behind
// its back (as an etcd outage longer than the TTL would): the worker
// registers again under a new lease.
func TestRegistrationSurvivesLeaseLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, cli := testenv.StartEtcd(t)
	info := kvevents.WorkerInfo{ID: "w1", Address: "10.0.0.7:8000", BlockSize: 16}
	reg, err := relay.Register(ctx, cli, "p", info, 5*time.Second, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	key := kvevents.WorkersPrefix("p") + "w1"
	if reg.Key() != key {
		t.Errorf("Key() = %q, want %q", reg.Key(), key)
	}
	waitKey(ctx, t, cli, key, true)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	first := resp.Kvs[0].Lease
	if _, err := cli.Revoke(ctx, clientv3LeaseID(first)); err != nil {
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, cli := testenv.StartEtcd(t)
	for _, info := range []kvevents.WorkerInfo{
		{ID: "a/b", Address: "x", BlockSize: 16},
		{ID: "w", BlockSize: 16},
		{ID: "w", Address: "x"},
	} {
		if _, err := relay.Register(ctx, cli, "p", info, 0, nil); err == nil {
			t.Errorf("Register(%+v) = nil error, want one", info)
		}
	}
}
