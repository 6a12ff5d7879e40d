// Package registry is membership's etcd half: registering a
// worker or a local router under a lease, and following a pool's workers or
// routers live.
//
// A Registration outlives etcd outages: its keep-alive is re-armed on the
// same lease, each attempt bounded by a timeout, and a new lease is granted
// only when etcd says the old one is gone. A worker that cannot publish its
// KV events marks its record stale (Registration.SetStale, fed by a
// StaleMarker from the publisher).
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
//
// Files: register.go (Register, RegisterRouter: leased keys), stale.go
// (StaleMarker: a worker's stale flag), watch.go (WatchPrefix), workers.go
// (Watcher: a pool's workers for a Handler).
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
// under a lease. When the keep-alive breaks (etcd unreachable, restarted)
// it is re-armed on the same lease, which an etcd restart keeps (etcd
// renews every lease's TTL when it comes back); only when etcd reports the
// lease gone does it register again under a new lease.
type Registration struct {
	cli    *clientv3.Client
	key    string
	value  string // guarded by mu
	ttl    int64
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	lease clientv3.LeaseID
	// value is the key's value (guarded by mu: SetStale changes it);
	// info is the worker record it encodes (nil for a router's key);
	// dirty: value changed but could not be written yet (the next re-arm
	// writes it).
	info   *membership.WorkerInfo
	dirty  bool
	closed bool
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
	r, err := RegisterKey(ctx, cli, membership.WorkerKey(pool, info.ID), value, ttl, log)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.info = &info
	r.mu.Unlock()
	return r, nil
}

// SetStale marks the worker's record stale or not (membership.WorkerInfo.
// Stale) and writes it under the current lease, each write bounded by a
// third of the TTL. When etcd cannot be reached the change is kept and
// written once the keep-alive is re-armed; the error says so. Only for a
// worker registration (Register).
func (r *Registration) SetStale(ctx context.Context, stale bool) error {
	r.mu.Lock()
	if r.info == nil {
		r.mu.Unlock()
		return fmt.Errorf("mark %s stale: not a worker registration", r.key)
	}
	if r.closed {
		r.mu.Unlock()
		return nil // deregistered: nothing to mark
	}
	if r.info.Stale == stale && !r.dirty {
		r.mu.Unlock()
		return nil
	}
	r.info.Stale = stale
	b, err := json.Marshal(*r.info)
	if err != nil {
		r.mu.Unlock()
		return fmt.Errorf("mark %s stale: %w", r.key, err)
	}
	r.value, r.dirty = string(b), true
	r.mu.Unlock()
	return r.write(ctx)
}

// write puts the current value under the current lease, clearing dirty.
func (r *Registration) write(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.callTimeout())
	defer cancel()
	r.mu.Lock()
	value, lease := r.value, r.lease
	r.mu.Unlock()
	if _, err := r.cli.Put(ctx, r.key, value, clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("update %s (written when etcd is back): %w", r.key, err)
	}
	r.mu.Lock()
	if r.value == value {
		r.dirty = false
	}
	r.mu.Unlock()
	return nil
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
	prev := r.lease
	r.lease = lease.ID
	value := r.value
	r.mu.Unlock()
	if _, err := r.cli.Put(ctx, r.key, value, clientv3.WithLease(lease.ID)); err != nil {
		// The key is not under the new lease: the lease a re-arm should
		// try (and Close revoke) is still the previous one. The new one
		// expires on its own.
		r.mu.Lock()
		r.lease = prev
		r.mu.Unlock()
		return nil, fmt.Errorf("register %s: put: %w", r.key, err)
	}
	r.mu.Lock()
	if r.value == value {
		r.dirty = false
	}
	r.mu.Unlock()
	ka, err := r.cli.KeepAlive(keepCtx, lease.ID)
	if err != nil {
		return nil, fmt.Errorf("register %s: keep alive: %w", r.key, err)
	}
	return ka, nil
}

// Lease is the id of the lease the key is held under now (it changes only
// when etcd reports the previous one gone).
func (r *Registration) Lease() clientv3.LeaseID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// callTimeout bounds each etcd call of a re-arm: a third of the TTL, at
// least 500 ms, so that several attempts fit in one TTL.
func (r *Registration) callTimeout() time.Duration {
	return max(time.Duration(r.ttl)*time.Second/3, 500*time.Millisecond)
}

// maxRetryWait caps the wait between re-arm attempts: a quarter of the TTL,
// at most 1 s, so a lease is re-armed well inside its TTL once etcd is back
// (etcd restarts leases' TTL clocks when it comes back; a prompt re-arm is
// what keeps the key).
func (r *Registration) maxRetryWait() time.Duration {
	return min(max(time.Duration(r.ttl)*time.Second/4, 100*time.Millisecond), time.Second)
}

// keep holds the lease until ctx ends. etcd's KeepAlive channel closes on
// errors (no answer within the TTL, a broken stream); keep then re-arms the
// keep-alive on the same lease, and only when etcd answers that the lease
// is gone grants a new one and writes the key again. While etcd cannot be
// reached there is nothing better to do than to retry: each attempt is
// bounded by callTimeout and the waits between them by maxRetryWait.
func (r *Registration) keep(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(r.done)
	for {
		for range ka {
		}
		if ctx.Err() != nil {
			return
		}
		var ok bool
		if ka, ok = r.rearm(ctx); !ok {
			return
		}
	}
}

// rearm restores the keep-alive after its channel closed: on the same lease
// while etcd still holds it, on a new lease (with the key written again)
// once etcd says it expired. It returns false when ctx ended first.
func (r *Registration) rearm(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, bool) {
	wait := 50 * time.Millisecond
	r.log.Warn("lease keep-alive stopped; re-arming", "lease", int64(r.Lease()))
	for attempt := 1; ; attempt++ {
		lease := r.Lease()
		ka, err := r.rearmOnce(ctx, lease)
		if err == nil {
			if attempt > 1 {
				r.log.Info("lease keep-alive re-armed", "lease", int64(r.Lease()), "attempts", attempt)
			}
			return ka, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		if attempt == 1 || attempt%20 == 0 {
			r.log.Warn("re-arm lease keep-alive", "lease", int64(lease), "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(wait):
		}
		wait = min(2*wait, r.maxRetryWait())
	}
}

func (r *Registration) rearmOnce(ctx context.Context, lease clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, r.callTimeout())
	defer cancel()
	resp, err := r.cli.KeepAliveOnce(cctx, lease)
	if err == nil && resp.TTL > 0 {
		r.mu.Lock()
		dirty := r.dirty
		r.mu.Unlock()
		if dirty {
			if err := r.write(ctx); err != nil {
				return nil, err
			}
		}
		return r.cli.KeepAlive(ctx, lease)
	}
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, err
	}
	r.log.Warn("lease expired in etcd; registering under a new lease", "lease", int64(lease))
	ka, err := r.put(cctx, ctx)
	if err != nil {
		return nil, err
	}
	return ka, nil
}

// Close stops the keep-alive and revokes the lease, deleting the key at
// once (routers see the worker leave without waiting for the TTL). A lease
// already gone (lost and not yet replaced) took the key with it: not an
// error. Close is idempotent.
func (r *Registration) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
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
