// Package registry registers an engine worker in etcd, where local routers
// discover their pool's workers: one key, kvevents.WorkersPrefix(pool) + the
// worker id, whose value is the JSON kvevents.WorkerInfo, kept alive under a
// lease. `kvgate relay` registers the vLLM or SGLang engine it relays for;
// `kvgate mocker` registers itself.
//
// It is a package of its own so that kvevents, which the local router's
// core imports, does not pull in the etcd client.
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

	"github.com/kvgate/kvgate/kvevents"
)

// Registration keeps one worker's etcd key (kvevents.WorkersPrefix(pool) +
// id, value a JSON kvevents.WorkerInfo) alive under a lease, the way
// routers discover workers. If the lease is lost (etcd unreachable longer
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
func Register(ctx context.Context, cli *clientv3.Client, pool string, info kvevents.WorkerInfo, ttl time.Duration, log *slog.Logger) (*Registration, error) {
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
	return RegisterKey(ctx, cli, kvevents.WorkersPrefix(pool)+info.ID, value, ttl, log)
}

// RegisterKey writes key = value under a lease of ttl (rounded up to whole
// seconds, at least 1 s; 0 means 10 s) and keeps it alive until Close,
// registering again if the lease is lost. ctx bounds the first write only.
// Local routers register themselves with it too.
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
