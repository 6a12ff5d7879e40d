package routing

import (
	"errors"
	"fmt"
	"time"
)

// WorkerKey names one data-parallel rank of one worker: the unit a local
// router's index and worker chain reason about, and the unit the client
// side (pool, global router) commits to.
type WorkerKey struct {
	ID     string
	DPRank uint32
}

func (k WorkerKey) String() string { return fmt.Sprintf("%s/%d", k.ID, k.DPRank) }

// Selected is the worker key of a selection.
func Selected(s Selection) WorkerKey { return WorkerKey{ID: s.WorkerID, DPRank: s.DPRank} }

// The errors a local router answers with. The local router returns them
// (wrapped) in process; its gRPC server sends each as a reason
// (api/localrouter/v1 Reason…) and its Go client unwraps the reason back to
// the same sentinel, so errors.Is(err, routing.ErrUnknownRequest) holds on
// both sides of the wire.
var (
	// ErrClosed: the router is closed.
	ErrClosed = errors.New("router is closed")
	// ErrNoWorkers: the pool has no worker.
	ErrNoWorkers = errors.New("no workers in the pool")
	// ErrNotReady: fewer workers than min_initial_workers joined yet.
	ErrNotReady = errors.New("router is not ready: fewer workers than min_initial_workers")
	// ErrUnknownWorker: a forced or named worker is not a member.
	ErrUnknownWorker = errors.New("unknown worker")
	// ErrEmptyRequest: neither token ids nor block hashes.
	ErrEmptyRequest = errors.New("request has neither token ids nor block hashes")
	// ErrUnknownRequest: no active request has the id.
	ErrUnknownRequest = errors.New("unknown request id")
	// ErrNoAllowedWorker: the endpoint subset (allowed addresses) admitted
	// none of the pool's workers.
	ErrNoAllowedWorker = errors.New("no worker of the pool is in the allowed set")
	// ErrDuplicateRequest: a commit with a request id that is already
	// active.
	ErrDuplicateRequest = errors.New("request id is already active")
	// ErrEmptyRequestID: a commit without a request id.
	ErrEmptyRequestID = errors.New("empty request id")
	// ErrBlockSizeMismatch: hashes (or a stored block) computed for another
	// block size than the pool's.
	ErrBlockSizeMismatch = errors.New("stored block has the wrong number of tokens")
	// ErrInvalidConfig wraps every configuration error of a local router
	// (its Config, a worker chain, a per-request override).
	ErrInvalidConfig = errors.New("invalid router config")
	// ErrReserveTTL: a reserving probe asked to hold its worker for more
	// than MaxReserveTTL.
	ErrReserveTTL = errors.New("reservation TTL over the bound")
)

// MaxReserveTTL bounds a reservation's lifetime: no caller, authenticated
// or not, in process or over gRPC, holds load on a worker by a reserving
// probe for longer (plus the one TTL a lapsed reservation is kept for its
// late confirmation). The one rule: the local router's core refuses a
// longer one (ErrReserveTTL), so its gRPC server and channel and its
// in-process clients (localrouter/inproc) all do, and the global router
// bounds probe.reserve_ttl by it.
const MaxReserveTTL = 10 * time.Second
