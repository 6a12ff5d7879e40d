package pool

import (
	"context"
	"errors"
)

// Router is a client of one local router: the part of the local-router
// service the global router uses. The gRPC client (GRPCDialer) implements
// it. Implementations are safe for concurrent use.
type Router interface {
	// Probe asks for the best worker for a prompt without changing any
	// state (BestWorker without request_id). It blocks until the answer or
	// until ctx ends.
	Probe(ctx context.Context, p Prompt) (Selection, error)
	// Track commits a request on the worker the caller chose and opens the
	// request's lifecycle stream. It returns once the commit is sent,
	// without waiting for the router's answer (the commit is pipelined);
	// committed is called once, from another goroutine, with the answer:
	// the worker's selection, or why the commit failed (the router refused
	// it, or the stream ended first; the request is then not on the
	// router). committed must not block. ctx bounds sending the commit
	// only: the stream lives until the Tracker is freed (or the connection
	// breaks, which frees the request on the router too). An error means
	// nothing was committed and committed is not called.
	Track(ctx context.Context, c Commit, committed func(Selection, error)) (Tracker, error)
	// Close releases the client. Open Trackers break, which frees their
	// requests on the router.
	Close() error
}

// Tracker is a committed request's lifecycle stream. Its methods are safe
// for concurrent use and idempotent, and may be called before the router
// answered the commit (events follow the commit on the stream, in order);
// PrefillComplete after Free does nothing; Free after any error, a refused
// commit included, still frees (the stream is closed). ctx bounds the wait
// for the router's acknowledgement.
type Tracker interface {
	PrefillComplete(ctx context.Context) error
	Free(ctx context.Context) error
}

// Prompt is what a local router needs of a request: the local block hashes
// of its complete blocks at the pool's block size (DESIGN.md §3).
type Prompt struct {
	Hashes []uint64
	// Tokens are sent instead of Hashes for a prompt shorter than one
	// block (it has no complete block to hash); ignored when Hashes is set.
	Tokens    []uint32
	BlockSize int
	// ISL is the prompt length in tokens.
	ISL int
	// LoRA is the adapter name ("" for the base model).
	LoRA string
	// Override changes the router's cost parameters for this request.
	Override *Override
}

// Override changes cost parameters for one request; nil fields keep the
// router's values.
type Override struct {
	OverlapScoreCredit *float64
	PrefillLoadScale   *float64
	RouterTemperature  *float64
}

// Commit records a request on a worker.
type Commit struct {
	RequestID string
	WorkerID  string
	DPRank    uint32
	Prompt    Prompt
}

// Selection is a local router's answer: a worker and the terms of its cost.
type Selection struct {
	WorkerID string
	DPRank   uint32
	// Address is the worker's host:port.
	Address       string
	OverlapBlocks int
	RequestBlocks int
	// PrefillTokens and DecodeBlocks are the worker's potential load with
	// the request.
	PrefillTokens int
	DecodeBlocks  int
	Cost          float64
	// Workers is how many (worker, dp_rank) the router considered.
	Workers   int
	BlockSize int
	// Router is the address of the local router that answered.
	Router string
}

// Errors of a Pool.
var (
	// ErrCircuitOpen: every local router of the pool is in backoff after
	// failing; the pool was not probed.
	ErrCircuitOpen = errors.New("circuit open")
	// ErrNoRouters: the pool has no local router (none discovered yet).
	ErrNoRouters = errors.New("no local router")
	// ErrClosed: the pool or its connections were closed.
	ErrClosed = errors.New("pool closed")
)
