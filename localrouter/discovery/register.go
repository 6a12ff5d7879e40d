package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/kvevents/registry"
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

// Register writes key = value under a lease of ttl and keeps it alive
// until the returned registration's Close (see registry.RegisterKey: the
// same code registers workers).
func Register(ctx context.Context, cli *clientv3.Client, key string, value []byte, ttl time.Duration, log *slog.Logger) (*registry.Registration, error) {
	if log == nil {
		log = slog.Default()
	}
	return registry.RegisterKey(ctx, cli, key, value, ttl, log.With("component", "localrouter.discovery"))
}
