package kvevents

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Subjects and keys shared by publishers, relays and routers (DESIGN.md §7).

// EventsSubject is the NATS subject of a pool's KV events.
func EventsSubject(pool string) string { return "kvgate." + pool + ".kv-events" }

// ActiveSeqsSubject is the NATS subject where a pool's router replicas share
// lifecycle events.
func ActiveSeqsSubject(pool string) string { return "kvgate." + pool + ".active-seqs" }

// DumpSubject is the NATS request-reply subject where a worker's publisher
// answers with its current blocks.
func DumpSubject(pool, worker string) string { return "kvgate." + pool + "." + worker + ".kv-dump" }

// WorkersPrefix is the etcd prefix of a pool's workers.
func WorkersPrefix(pool string) string { return "/kvgate/pools/" + pool + "/workers/" }

// RoutersPrefix is the etcd prefix of a pool's local routers.
func RoutersPrefix(pool string) string { return "/kvgate/pools/" + pool + "/routers/" }

// Worker roles.
const (
	RoleAggregated = "aggregated"
	RolePrefill    = "prefill"
	RoleDecode     = "decode"
)

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
	// Role is aggregated (default), prefill or decode.
	Role string `json:"role,omitempty"`
	// KVCapacityBlocks is the engine's KV cache size in blocks (0 unknown).
	KVCapacityBlocks int `json:"kv_capacity_blocks,omitempty"`
	// MetricsURL is the engine's Prometheus metrics endpoint, scraped by
	// the local router for engine signals ("": http://<Address>/metrics,
	// where vLLM, SGLang and the mocker serve it).
	MetricsURL string `json:"metrics_url,omitempty"`
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
	switch {
	case w.ID == "" || strings.ContainsAny(w.ID, "/. *>"):
		return fmt.Errorf("worker id %q: must be non-empty without '/', '.', ' ', '*', '>'", w.ID)
	case w.Address == "":
		return fmt.Errorf("worker %q: empty address", w.ID)
	case w.DPSize < 1:
		return fmt.Errorf("worker %q: dp_size %d must be ≥ 1", w.ID, w.DPSize)
	case w.BlockSize <= 0:
		return fmt.Errorf("worker %q: block_size %d must be positive", w.ID, w.BlockSize)
	}
	switch w.Role {
	case "", RoleAggregated, RolePrefill, RoleDecode:
	default:
		return fmt.Errorf("worker %q: unknown role %q (want aggregated, prefill or decode)", w.ID, w.Role)
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
