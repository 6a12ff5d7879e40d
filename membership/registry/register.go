// Package registry is membership's etcd half (DESIGN.md §7): registering a
// worker or a local router under a lease, and following a pool's workers or
// routers live.
//
// Workers register with Register under membership.WorkerKey(pool, id), a
// JSON membership.WorkerInfo value (`kvgate relay` for the vLLM or SGLang
// engine it relays for; `kvgate mocker` for itself). Local routers register
// with RegisterRouter under membership.RouterKey. A Watcher follows a
// pool's workers and tells its Handler; WatchPrefix is the revision-correct
// get+watch it rests on, also used by the global router to follow a pool's
// local routers.
//
// It is a package apart from membership so that the records and the Role
// type, which policies and the KV-event code import, do not pull in the
// etcd client.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/membership"
)

// Registration keeps one etcd key (a worker's or a local router's) alive
// under a lease. If the lease is lost (etcd unreachable longer
// than the TTL) it registers again with a new lease.
type Registration struct {
	cli    *clientv3.Client
	key    string
	value  string
	ttl    int64
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	lease clientv3.LeaseID
}

// Register writes info under its pool's workers prefix with a lease of ttl
// (rounded up to whole seconds, at least 1 s; 0 means 10 s) and keeps it
// alive until Close. It returns once the key is written.
func Register(ctx context.Context, cli *clientv3.Client, pool string, info membership.WorkerInfo, ttl time.Duration, log *slog.Logger) (*Registration, error) {
	if info.DPSize == 0 {
		info.DPSize = 1
	}
	if err := info.Validate(); err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	value, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	return RegisterKey(ctx, cli, membership.WorkerKey(pool, info.ID), value, ttl, log)
}

// RegisterRouter writes a local router's info under
// membership.RouterKey(info.Pool, info.ID) with a lease of ttl (as
// Register) and keeps it alive until Close.
func RegisterRouter(ctx context.Context, cli *clientv3.Client, info membership.RouterInfo, ttl time.Duration, log *slog.Logger) (*Registration, error) {
	if err := info.Validate(); err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	value, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	return RegisterKey(ctx, cli, membership.RouterKey(info.Pool, info.ID), value, ttl, log)
}

// RegisterKey writes key = value under a lease of ttl (rounded up to whole
// seconds, at least 1 s; 0 means 10 s) and keeps it alive until Close,
// registering again if the lease is lost. ctx bounds the first write only.
func RegisterKey(ctx context.Context, cli *clientv3.Client, key string, value []byte, ttl time.Duration, log *slog.Logger) (*Registration, error) {
	if ttl == 0 {
		ttl = 10 * time.Second
	}
	secs := max(int64((ttl+time.Second-1)/time.Second), 1)
	if log == nil {
		log = slog.Default()
	}
	r := &Registration{
		cli:   cli,
		key:   key,
		value: string(value),
		ttl:   secs,
		log:   log.With("component", "registration", "key", key),
		done:  make(chan struct{}),
	}
	keepCtx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	ka, err := r.put(ctx, keepCtx)
	if err != nil {
		cancel()
		return nil, err
	}
	go r.keep(keepCtx, ka)
	return r, nil
}

// Key is the etcd key the registration holds.
func (r *Registration) Key() string { return r.key }

func (r *Registration) put(ctx, keepCtx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	lease, err := r.cli.Grant(ctx, r.ttl)
	if err != nil {
		return nil, fmt.Errorf("register %s: grant lease: %w", r.key, err)
	}
	// Recorded before the key is written: once the key is visible under
	// this lease, Close must revoke this lease, even if Close stops the
	// keep-alive before it starts.
	r.mu.Lock()
	r.lease = lease.ID
	r.mu.Unlock()
	if _, err := r.cli.Put(ctx, r.key, r.value, clientv3.WithLease(lease.ID)); err != nil {
		return nil, fmt.Errorf("register %s: put: %w", r.key, err)
	}
	ka, err := r.cli.KeepAlive(keepCtx, lease.ID)
	if err != nil {
		return nil, fmt.Errorf("register %s: keep alive: %w", r.key, err)
	}
	return ka, nil
}

func (r *Registration) keep(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(r.done)
	backoff := 100 * time.Millisecond
	for {
		for range ka {
		}
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("lease lost; registering again")
		for {
			var err error
			ka, err = r.put(ctx, ctx)
			if err == nil {
				backoff = 100 * time.Millisecond
				break
			}
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("register again", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// Close stops the keep-alive and revokes the lease, deleting the key at
// once (routers see the worker leave without waiting for the TTL). A lease
// already gone (lost and not yet replaced) took the key with it: not an
// error. Close is idempotent.
func (r *Registration) Close() error {
	r.cancel()
	<-r.done
	r.mu.Lock()
	lease := r.lease
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("deregister %s: %w", r.key, err)
	}
	return nil
}
