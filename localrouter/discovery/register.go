package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/kvevents"
)

// RouterInfo is the value of a local router's etcd key under
// kvevents.RoutersPrefix(pool): where global routers reach it.
type RouterInfo struct {
	ID string `json:"id"`
	// GRPCAddress is the router's gRPC endpoint, host:port.
	GRPCAddress string `json:"grpc_address"`
	Pool        string `json:"pool"`
	// BlockSize is the pool's KV block size: callers hash prompts with it.
	BlockSize int `json:"block_size"`
}

// Validate checks the fields a global router relies on.
func (r RouterInfo) Validate() error {
	switch {
	case r.ID == "" || strings.ContainsAny(r.ID, "/ "):
		return fmt.Errorf("router id %q: must be non-empty without '/' or ' '", r.ID)
	case r.GRPCAddress == "":
		return fmt.Errorf("router %q: empty grpc_address", r.ID)
	case r.Pool == "":
		return fmt.Errorf("router %q: empty pool", r.ID)
	case r.BlockSize <= 0:
		return fmt.Errorf("router %q: block_size %d must be positive", r.ID, r.BlockSize)
	}
	return nil
}

// ParseRouterInfo decodes and validates an etcd router value.
func ParseRouterInfo(b []byte) (RouterInfo, error) {
	var r RouterInfo
	if err := json.Unmarshal(b, &r); err != nil {
		return RouterInfo{}, fmt.Errorf("router info: %w", err)
	}
	return r, r.Validate()
}

// RouterKey is the etcd key of router id in pool.
func RouterKey(pool, id string) string { return kvevents.RoutersPrefix(pool) + id }

// Registration keeps one key alive under a lease; Close removes it.
type Registration struct {
	cli   *clientv3.Client
	key   string
	value string
	ttl   int64
	log   *slog.Logger

	mu    sync.Mutex
	lease clientv3.LeaseID

	stop chan struct{}
	done chan struct{}
}

// Register writes key = value under a lease of ttl (whole seconds, at least
// 1) and keeps the lease alive until Close. If the lease is lost (etcd
// unreachable for longer than ttl), it registers again once etcd answers.
// ctx bounds the first registration only.
func Register(ctx context.Context, cli *clientv3.Client, key string, value []byte, ttl time.Duration, log *slog.Logger) (*Registration, error) {
	if log == nil {
		log = slog.Default()
	}
	secs := int64(ttl / time.Second)
	if secs < 1 {
		secs = 1
	}
	r := &Registration{
		cli: cli, key: key, value: string(value), ttl: secs,
		log:  log.With("component", "localrouter.discovery", "key", key),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	ka, cancel, err := r.register(ctx)
	if err != nil {
		return nil, err
	}
	go r.keepAlive(ka, cancel)
	return r, nil
}

// register grants a lease, puts the key under it and starts its
// keep-alive, which runs until cancel.
func (r *Registration) register(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, context.CancelFunc, error) {
	g, err := r.cli.Grant(ctx, r.ttl)
	if err != nil {
		return nil, nil, fmt.Errorf("register %s: grant lease: %w", r.key, err)
	}
	if _, err := r.cli.Put(ctx, r.key, r.value, clientv3.WithLease(g.ID)); err != nil {
		return nil, nil, fmt.Errorf("register %s: %w", r.key, err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	ka, err := r.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("register %s: keep lease alive: %w", r.key, err)
	}
	r.mu.Lock()
	r.lease = g.ID
	r.mu.Unlock()
	return ka, cancel, nil
}

func (r *Registration) keepAlive(ka <-chan *clientv3.LeaseKeepAliveResponse, cancel context.CancelFunc) {
	defer close(r.done)
	defer func() { cancel() }()
	for {
		// Drain answers; the channel closes when the lease is lost or at stop.
	drain:
		for {
			select {
			case _, ok := <-ka:
				if !ok {
					break drain
				}
			case <-r.stop:
				return
			}
		}
		cancel()
		r.log.Warn("registration lease lost; registering again")
		for {
			ctx, cctx := context.WithTimeout(context.Background(), 5*time.Second)
			next, nextCancel, err := r.register(ctx)
			cctx()
			if err == nil {
				ka, cancel = next, nextCancel
				break
			}
			r.log.Warn("registering again failed", "err", err)
			select {
			case <-r.stop:
				return
			case <-time.After(retryDelay):
			}
		}
	}
}

// Close stops the keep-alive and revokes the lease, which deletes the key.
// ctx bounds the revocation.
func (r *Registration) Close(ctx context.Context) error {
	select {
	case <-r.stop:
		return nil
	default:
	}
	close(r.stop)
	<-r.done
	r.mu.Lock()
	lease := r.lease
	r.mu.Unlock()
	if _, err := r.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("deregister %s: %w", r.key, err)
	}
	return nil
}
