package membership

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Role is what a worker (and a pool made of such workers) does.
type Role string

// Roles.
const (
	// RoleAggregated workers prefill and decode.
	RoleAggregated Role = "aggregated"
	// RolePrefill workers only prefill; they serve a request only as the
	// prefill half of a disaggregated pair.
	RolePrefill Role = "prefill"
	// RoleDecode workers decode, and prefill locally when no prefill
	// worker is used.
	RoleDecode Role = "decode"
)

// Valid reports whether r is one of the roles above.
func (r Role) Valid() bool {
	return r == RoleAggregated || r == RolePrefill || r == RoleDecode
}

// String returns the role's name.
func (r Role) String() string { return string(r) }

// Set implements flag.Value, so a flag can hold a Role.
func (r *Role) Set(s string) error {
	v := Role(strings.TrimSpace(s))
	if !v.Valid() {
		return fmt.Errorf("unknown role %q (want aggregated, prefill or decode)", s)
	}
	*r = v
	return nil
}

// WorkersPrefix is the etcd prefix of a pool's workers.
func WorkersPrefix(pool string) string { return "/kvgate/pools/" + pool + "/workers/" }

// RoutersPrefix is the etcd prefix of a pool's local routers.
func RoutersPrefix(pool string) string { return "/kvgate/pools/" + pool + "/routers/" }

// WorkerKey is the etcd key of worker id in pool.
func WorkerKey(pool, id string) string { return WorkersPrefix(pool) + id }

// RouterKey is the etcd key of router id in pool.
func RouterKey(pool, id string) string { return RoutersPrefix(pool) + id }

// WorkerInfo is the value of a worker's etcd key: what a router needs to know
// to route to it.
type WorkerInfo struct {
	ID string `json:"id"`
	// Address is the worker's HTTP endpoint, host:port.
	Address string `json:"address"`
	// DPSize is the number of data-parallel ranks (≥ 1).
	DPSize int `json:"dp_size"`
	// BlockSize is the engine's KV block size in tokens.
	BlockSize int    `json:"block_size"`
	Model     string `json:"model"`
	// Role is aggregated (default, also when empty), prefill or decode.
	Role Role `json:"role,omitempty"`
	// KVCapacityBlocks is the engine's KV cache size in blocks (0 unknown).
	KVCapacityBlocks int `json:"kv_capacity_blocks,omitempty"`
	// MetricsURL is the engine's Prometheus metrics endpoint, scraped by
	// the local router for engine signals ("": http://<Address>/metrics,
	// where vLLM, SGLang and the mocker serve it).
	MetricsURL string `json:"metrics_url,omitempty"`
	// Stale is set by the worker while it cannot publish its KV events
	// (NATS unreachable, publishes failing): routers keep it a member
	// (its in-flight requests stay counted) but send it no new requests
	// while a fresh worker is left, and ask it for a dump when it clears.
	Stale bool `json:"stale,omitempty"`
}

// MetricsEndpoint is MetricsURL, or the default derived from Address.
func (w WorkerInfo) MetricsEndpoint() string {
	if w.MetricsURL != "" {
		return w.MetricsURL
	}
	return "http://" + w.Address + "/metrics"
}

// Validate checks the fields a router relies on.
func (w WorkerInfo) Validate() error {
	if err := ValidateWorkerID(w.ID); err != nil {
		return err
	}
	switch {
	case w.Address == "":
		return fmt.Errorf("worker %q: empty address", w.ID)
	case w.DPSize < 1:
		return fmt.Errorf("worker %q: dp_size %d must be ≥ 1", w.ID, w.DPSize)
	case w.BlockSize <= 0:
		return fmt.Errorf("worker %q: block_size %d must be positive", w.ID, w.BlockSize)
	case w.Role != "" && !w.Role.Valid():
		return fmt.Errorf("worker %q: unknown role %q (want aggregated, prefill or decode)", w.ID, w.Role)
	}
	return nil
}

// ValidateWorkerID checks that id can be an etcd key element and a NATS
// subject token.
func ValidateWorkerID(id string) error {
	if id == "" || strings.ContainsAny(id, "/. *>") {
		return fmt.Errorf("worker id %q: must be non-empty without '/', '.', ' ', '*', '>'", id)
	}
	return nil
}

// ParseWorkerInfo decodes and validates an etcd worker value.
func ParseWorkerInfo(b []byte) (WorkerInfo, error) {
	var w WorkerInfo
	if err := json.Unmarshal(b, &w); err != nil {
		return WorkerInfo{}, fmt.Errorf("worker info: %w", err)
	}
	if w.DPSize == 0 {
		w.DPSize = 1
	}
	return w, w.Validate()
}

// RouterInfo is the value of a local router's etcd key under
// RoutersPrefix(pool): where global routers reach it.
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
