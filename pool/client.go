package pool

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter/client"
)

// Client is a client of one local router: the part of the local-router
// service the global router uses. The gRPC client (GRPCDialer, over
// localrouter/client) implements it. Implementations are safe for
// concurrent use.
type Client interface {
	// Probe asks for the best worker for a prompt without changing any
	// state (BestWorker without request_id). It blocks until the answer or
	// until ctx ends.
	Probe(ctx context.Context, p Prompt) (routing.Selection, error)
	// Loads returns every worker rank's potential load for a prompt, as
	// Selections (worker, address, overlap, potential prefill tokens and
	// decode blocks; no cost), without changing any state
	// (PotentialLoads). It blocks until the answer or until ctx ends.
	Loads(ctx context.Context, p Prompt) ([]routing.Selection, error)
	// CommitAsync commits a request on the worker the caller chose (or,
	// with no Commit.WorkerID, on the one the router chooses: see Commit)
	// and opens the request's lifecycle stream. It returns once the commit is
	// sent, without waiting for the router's answer (the commit is
	// pipelined); committed is called once, from another goroutine, with
	// the answer: the worker's selection, or why the commit failed (the
	// router refused it, or the stream ended first; the request is then
	// not on the router). committed must not block. ctx bounds sending the
	// commit only: the stream lives until the Tracker is freed (or the
	// connection breaks, which frees the request on the router too). An
	// error means nothing was committed and committed is not called.
	CommitAsync(ctx context.Context, c Commit, committed func(routing.Selection, error)) (Tracker, error)
	// Close releases the client. Open Trackers break, which frees their
	// requests on the router.
	Close() error
}

// Releaser is a Client whose router holds reservations (Prompt.ReserveID):
// Release releases request id's reservation, best effort and without
// waiting for the router's answer; a Client that is no Releaser leaves a
// reservation to its TTL. Safe for concurrent use; must not block past
// sending.
type Releaser interface {
	Release(ctx context.Context, id string) error
}

// OrderedReleaser is a Releaser whose ReleaseOrdered returns once the
// release is sure to be handled before any message the caller sends the
// router after it (a probe reserving again for the same request, say): on
// a channel, a release sent on the stream (handled in order, not waited
// for); on unary calls, a Free waited for.
type OrderedReleaser interface {
	ReleaseOrdered(ctx context.Context, id string) error
}

// Dialer makes a Client for a local router's gRPC address.
type Dialer func(addr string) (Client, error)

// GRPCDialer returns a Dialer of gRPC clients (localrouter/client;
// insecure transport unless opts say otherwise). Connections are made
// lazily, on the first call. gRPC's reconnection backoff is capped at 5 s
// (its default, 120 s, would keep a router that came back unreachable long
// after its circuit let a trial probe through).
func GRPCDialer(opts ...grpc.DialOption) Dialer {
	return func(addr string) (Client, error) {
		all := append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
				MinConnectTimeout: 5 * time.Second,
			}),
			// Static flow-control windows turn off gRPC's bandwidth-delay
			// estimator, whose pings rode along every probe: a frame each
			// way to write, read and answer. Probes and commits are small;
			// 1 MiB covers any prompt's hashes many times.
			grpc.WithInitialWindowSize(1 << 20),
			grpc.WithInitialConnWindowSize(1 << 20),
		}, opts...)
		c, err := client.Dial(addr, all)
		if err != nil {
			return nil, err
		}
		return &grpcClient{c: c, addr: addr}, nil
	}
}

// grpcClient is a Client over localrouter/client.
type grpcClient struct {
	c    *client.Client
	addr string
}

func (p Prompt) client() client.Prompt {
	return client.Prompt{Tokens: p.Tokens, BlockHashes: p.Hashes, BlockSize: p.BlockSize, ISL: p.ISL, LoRAName: p.LoRA, SessionKey: p.SessionKey}
}

func (g *grpcClient) Probe(ctx context.Context, p Prompt) (routing.Selection, error) {
	sel, err := g.c.BestWorker(ctx, p.client(), p.probeOptions())
	sel.Router = g.addr
	return sel, err
}

// Release implements Releaser with a unary Free of the reservation, on a
// goroutine of its own (the caller does not wait); its error is dropped,
// the TTL expires what it missed.
func (g *grpcClient) Release(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	go func() {
		defer cancel()
		_ = g.c.Release(ctx, id)
	}()
	return nil
}

// ReleaseOrdered implements OrderedReleaser: a unary Free of the
// reservation, waited for (bounded by releaseTimeout).
func (g *grpcClient) ReleaseOrdered(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	return g.c.Release(ctx, id)
}

// releaseTimeout bounds a unary release: past it the reservation's TTL
// (a few hundred ms at most) has run out anyway.
const releaseTimeout = time.Second

// probeOptions are p's probe options on the wire: the bounds and, for a
// reserving probe, the reservation.
func (p Prompt) probeOptions() client.BestWorkerOptions {
	return client.BestWorkerOptions{Override: p.Override, AllowedAddresses: p.Allowed, RequestID: p.ReserveID, ReserveTTL: p.ReserveTTL}
}

func (g *grpcClient) Loads(ctx context.Context, p Prompt) ([]routing.Selection, error) {
	ls, err := g.c.PotentialLoads(ctx, p.client())
	if err != nil {
		return nil, err
	}
	out := make([]routing.Selection, len(ls))
	for i, l := range ls {
		out[i] = routing.Selection{WorkerID: l.Worker.ID, DPRank: l.Worker.DPRank, Address: l.Address,
			OverlapBlocks: l.OverlapBlocks, PrefillTokens: l.PotentialPrefillTokens, DecodeBlocks: l.PotentialDecodeBlocks,
			BlockSize: p.BlockSize, Router: g.addr}
	}
	return out, nil
}

func (g *grpcClient) CommitAsync(ctx context.Context, c Commit, committed func(routing.Selection, error)) (Tracker, error) {
	// Pool.CommitAsync names the router in the answer: no wrapper here.
	t, err := g.c.CommitAsyncWith(ctx, c.RequestID, routing.WorkerKey{ID: c.WorkerID, DPRank: c.DPRank}, c.Prompt.client(), c.options(), committed)
	if err != nil {
		return nil, err
	}
	return t, nil
}

func (g *grpcClient) Close() error { return g.c.Close() }

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
// of its complete blocks at the pool's block size.
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
	// SessionKey is the request's session ("" for none), for the pools'
	// worker chains (the session scorer).
	SessionKey string
	// Override changes the router's cost parameters for this request.
	Override *routing.Override
	// Allowed, when not empty, restricts a probe to the workers at these
	// addresses (an Inference Extension endpoint subset); see
	// client.BestWorkerOptions.AllowedAddresses. Commits naming their
	// worker ignore it (and Override); a commit without one is bounded by
	// both.
	Allowed []string
	// ReserveID, with ReserveTTL, makes a probe a reserving probe: the
	// router holds the worker it names for request ReserveID (its load
	// counted by every later probe, the KV index untouched) until a
	// commit with Commit.Reserved confirms it, Release releases it or
	// ReserveTTL passes (probe.commit: reserve). Commits ignore both.
	ReserveID  string
	ReserveTTL time.Duration
}

// Commit records a request on a worker. With no WorkerID it is a
// decide-and-commit: the local router chooses the worker, as a probe
// would (within Prompt.Allowed, with Prompt.Override, never one of
// Exclude), and records the request there in the same step; its answer
// names the worker.
type Commit struct {
	RequestID string
	WorkerID  string
	DPRank    uint32
	Prompt    Prompt
	// Exclude are worker addresses (host:port) a commit without WorkerID
	// must not choose: those passive health ejected.
	Exclude []string
	// Reserved confirms the reservation the request's probe made on this
	// router (Prompt.ReserveID): the reservation becomes the request on
	// WorkerID, which must be set (see client.CommitOptions.Reserved).
	Reserved bool
	// Unanswered, with Reserved, lets the confirmation go unanswered,
	// carrying no prompt, where the transport offers it (see
	// client.CommitOptions.Unanswered: set it only when the reservation is
	// surely held).
	Unanswered bool
}

// options are a commit's bounds on the wire (a commit without a worker
// only).
func (c Commit) options() client.CommitOptions {
	if c.WorkerID != "" {
		return client.CommitOptions{Reserved: c.Reserved, Unanswered: c.Reserved && c.Unanswered}
	}
	return client.CommitOptions{Override: c.Prompt.Override, AllowedAddresses: c.Prompt.Allowed, ExcludedAddresses: c.Exclude}
}

// Errors of a Pool.
var (
	// ErrCircuitOpen: every local router of the pool is in backoff after
	// failing; the pool was not probed.
	ErrCircuitOpen = errors.New("circuit open")
	// ErrNoRouters: the pool has no local router (none discovered yet).
	ErrNoRouters = errors.New("no local router")
	// ErrAllEjected: passive health ejected every worker the pool's
	// local router knows (their connections fail).
	ErrAllEjected = errors.New("every worker ejected")
	// ErrUnknownWorker: the local router knows no such worker (or rank):
	// the router's own sentinel, matched across the wire.
	ErrUnknownWorker = routing.ErrUnknownWorker
	// ErrClosed: the pool or its connections were closed.
	ErrClosed = errors.New("pool closed")
)
