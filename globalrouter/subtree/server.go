// Package subtree serves a global router's subtree (globalrouter.Subtree)
// over the local router's gRPC API (api/localrouter/v1), so that a parent
// global router's pool can be this router: its probes (BestWorker without a
// request id, the Channel's probes, PotentialLoads) are answered over this
// router's pools, and its commits and lifecycle events are forwarded to the
// pool that owns the worker (docs/hierarchy.md).
//
// What the service answers: BestWorker, PotentialLoads, Commit, Track,
// MarkPrefillComplete, Free, Channel, Stats, and the standard health
// service; DumpEvents and Workers are UNIMPLEMENTED (a subtree holds no KV
// index and no membership of its own: ask its pools' local routers).
// Every call's hop count (pool.HopsMetadata) is read from its metadata
// and the subtree refuses a call past its maximum depth
// (FAILED_PRECONDITION, "routing loop or tree deeper than N").
//
// Lifecycle: a request committed on a Track stream or a Channel stream is
// freed below when the stream ends, however it ends (break means free, as
// on a local router); one committed by Commit or BestWorker(request_id)
// lives until Free, or until a Track stream attaches to it, or, when
// ExpireAnonymous is on (internal/subtreed turns it on without mutual TLS,
// -anonymous-commit-expiry), until that expiry frees it.
//
// internal/subtreed runs it as part of `kvgate extproc` (-subtree-listen):
// the listener, TLS and -authorized-clients as the local router's gRPC,
// and the etcd registration as a router of -subtree-pool. The Track
// stream's events are api/localrouter/track's loop, shared with the local
// router's server, so this package links neither the local router's core
// nor its server.
//
// Files: server.go (Server, NewServer, Register; the unary calls, the
// Track stream, the probe and commit over the subtree's pools, the
// conversions to and from the wire), channel.go (the Channel stream: its
// messages in flight, freed when it ends), anonexpiry.go (ExpireAnonymous:
// unary commits freed after a bound on a service without client
// identity).
package subtree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/localrouter/track"
	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/pool"
)

// ChannelMaxInFlight is the probes and commits a Channel stream may have
// unanswered before the server stops reading (told in the hello).
const ChannelMaxInFlight = 1024

// ServiceName is the gRPC service (and health service) name.
const ServiceName = "kvgate.localrouter.v1.LocalRouter"

// Server implements localrouterv1.LocalRouterServer over a subtree. Safe
// for concurrent use.
type Server struct {
	localrouterv1.UnimplementedLocalRouterServer

	st       *globalrouter.Subtree
	pool, id string
	log      *slog.Logger
	health   *health.Server

	mu     sync.Mutex
	manual map[string]pool.Tracker // committed by Commit or BestWorker(request_id)
	// The anonymous-commit expiry of manual requests (anonexpiry.go),
	// guarded by mu.
	anonAfter   time.Duration
	anonExpired func()
	anonTimers  map[string]*time.Timer
	anonClosed  bool

	active atomic.Int64 // requests committed below and not freed
}

var _ localrouterv1.LocalRouterServer = (*Server)(nil)

// NewServer returns the service of st, named as router id of poolName
// (Stats). Register it with Register.
func NewServer(st *globalrouter.Subtree, poolName, id string, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{st: st, pool: poolName, id: id, health: health.NewServer(), manual: map[string]pool.Tracker{},
		log: log.With("component", "globalrouter.subtree", "pool", poolName)}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// Register registers the service and the health service on g.
func (s *Server) Register(g *grpc.Server) {
	localrouterv1.RegisterLocalRouterServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// Shutdown sets the health to NOT_SERVING for good (draining).
func (s *Server) Shutdown() { s.health.Shutdown(); s.stopAnon() }

// Active is the number of requests committed through the service and not
// yet freed.
func (s *Server) Active() int { return int(s.active.Load()) }

// callContext is ctx carrying the incoming call's hop count to the
// subtree (which checks it and adds one for the calls it makes).
func callContext(ctx context.Context) (context.Context, error) {
	h, err := pool.IncomingHops(ctx)
	if err != nil {
		return ctx, status.Error(codes.InvalidArgument, err.Error())
	}
	return pool.WithHops(ctx, h), nil
}

// prompt converts a wire Prompt.
func prompt(p *localrouterv1.Prompt, packed []byte) (pool.Prompt, error) {
	if p == nil {
		return pool.Prompt{}, statusOf(codes.InvalidArgument, localrouterv1.ReasonEmptyRequest, "no prompt")
	}
	out := pool.Prompt{Hashes: p.GetBlockHashes(), Tokens: p.GetTokenIds(), BlockSize: int(p.GetBlockSize()), ISL: int(p.GetIslTokens()), LoRA: p.GetLoraName(), SessionKey: p.GetSessionKey()}
	if len(packed) > 0 {
		if len(packed)%8 != 0 {
			return pool.Prompt{}, statusOf(codes.InvalidArgument, localrouterv1.ReasonInvalidArgument, fmt.Sprintf("packed_hashes is %d bytes, not a multiple of 8", len(packed)))
		}
		out.Hashes = make([]uint64, len(packed)/8)
		for i := range out.Hashes {
			b := packed[i*8:]
			out.Hashes[i] = uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 | uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
		}
	}
	if len(out.Hashes) == 0 && len(out.Tokens) == 0 {
		return pool.Prompt{}, statusOf(codes.InvalidArgument, localrouterv1.ReasonEmptyRequest, "the prompt has no tokens and no block hashes")
	}
	if len(out.Hashes) > 0 {
		out.Tokens = nil
		if out.BlockSize <= 0 {
			return pool.Prompt{}, statusOf(codes.InvalidArgument, localrouterv1.ReasonBlockSizeMismatch, "block_hashes without a block_size")
		}
		if out.ISL == 0 {
			out.ISL = len(out.Hashes) * out.BlockSize
		}
	} else if out.ISL == 0 {
		out.ISL = len(out.Tokens)
	}
	return out, nil
}

func override(o *localrouterv1.ConfigOverride) (*routing.Override, error) {
	if o == nil {
		return nil, nil
	}
	out := &routing.Override{}
	if o.OverlapScoreCredit != nil {
		v := o.GetOverlapScoreCredit()
		out.OverlapScoreCredit = &v
	}
	if o.PrefillLoadScale != nil {
		v := o.GetPrefillLoadScale()
		out.PrefillLoadScale = &v
	}
	if o.RouterTemperature != nil {
		v := o.GetRouterTemperature()
		out.RouterTemperature = &v
	}
	if err := out.Validate(); err != nil {
		return nil, statusOf(codes.InvalidArgument, localrouterv1.ReasonInvalidConfig, err.Error())
	}
	return out, nil
}

func statusOf(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	if reason != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Domain: localrouterv1.ErrorDomain, Reason: reason}); err == nil {
			st = d
		}
	}
	return st.Err()
}

// toStatus is err as the wire carries it: the status of the subtree's or
// the owning router's answer (code and reason kept), context errors as
// theirs, and UNAVAILABLE for what is left (a pool unreachable below).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, routing.ErrUnknownRequest):
		return statusOf(codes.NotFound, localrouterv1.ReasonUnknownRequest, err.Error())
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

func selection(sel routing.Selection) *localrouterv1.Selection {
	return &localrouterv1.Selection{
		WorkerId: sel.WorkerID, DpRank: sel.DPRank, Address: sel.Address,
		OverlapBlocks: uint32(sel.OverlapBlocks), RequestBlocks: uint32(sel.RequestBlocks),
		PotentialPrefillTokens: uint32(sel.PrefillTokens), PotentialDecodeBlocks: uint32(sel.DecodeBlocks),
		Cost: sel.Cost, ChainScore: sel.ChainScore, Candidates: uint32(sel.Candidates), BlockSize: uint32(sel.BlockSize),
		Scores: scores(sel.Scores),
	}
}

// scores are the owning pool's worker-chain scores, as its local router
// gave them.
func scores(sc []routing.Score) []*localrouterv1.Score {
	if len(sc) == 0 {
		return nil
	}
	out := make([]*localrouterv1.Score, len(sc))
	for i, v := range sc {
		out[i] = &localrouterv1.Score{Name: v.Name, Raw: v.Raw, Weight: v.Weight, Contribution: v.Contribution}
	}
	return out
}

func (s *Server) probe(ctx context.Context, p *localrouterv1.Prompt, packed []byte, o *localrouterv1.ConfigOverride, allowed []string) (*localrouterv1.Selection, error) {
	ctx, err := callContext(ctx)
	if err != nil {
		return nil, err
	}
	pr, err := prompt(p, packed)
	if err != nil {
		return nil, err
	}
	if pr.Override, err = override(o); err != nil {
		return nil, err
	}
	pr.Allowed = allowed
	sel, err := s.st.Probe(ctx, pr)
	if err != nil {
		return nil, toStatus(err)
	}
	return selection(sel), nil
}

// commit records a request below; the caller owns the Tracker.
func (s *Server) commit(ctx context.Context, in *localrouterv1.CommitRequest) (pool.Tracker, routing.Selection, error) {
	ctx, err := callContext(ctx)
	if err != nil {
		return nil, routing.Selection{}, err
	}
	if in.GetRequestId() == "" {
		return nil, routing.Selection{}, statusOf(codes.InvalidArgument, localrouterv1.ReasonEmptyRequestID, "commit: no request_id")
	}
	pr, err := prompt(in.GetPrompt(), nil)
	if err != nil {
		return nil, routing.Selection{}, err
	}
	t, sel, err := s.st.Commit(ctx, pool.Commit{RequestID: in.GetRequestId(), WorkerID: in.GetWorkerId(), DPRank: in.GetDpRank(), Prompt: pr})
	if err != nil {
		return nil, routing.Selection{}, toStatus(err)
	}
	s.active.Add(1)
	return &counted{Tracker: t, s: s}, sel, nil
}

// counted is a Tracker counted in Server.active until freed.
type counted struct {
	pool.Tracker
	s    *Server
	once sync.Once
}

func (c *counted) Free(ctx context.Context) error {
	err := c.Tracker.Free(ctx)
	c.once.Do(func() { c.s.active.Add(-1) })
	return err
}

// keep records a manually managed request (freed by Free).
func (s *Server) keep(ctx context.Context, id string, t pool.Tracker) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.manual[id]; dup {
		_ = t.Free(context.WithoutCancel(ctx))
		return statusOf(codes.AlreadyExists, localrouterv1.ReasonDuplicateRequest, fmt.Sprintf("request %q is already committed", id))
	}
	s.manual[id] = t
	s.watchAnon(id, t)
	return nil
}

func (s *Server) take(id string) (pool.Tracker, error) {
	if id == "" {
		return nil, statusOf(codes.InvalidArgument, localrouterv1.ReasonEmptyRequestID, "no request_id")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.manual[id]
	if !ok {
		return nil, statusOf(codes.NotFound, localrouterv1.ReasonUnknownRequest, fmt.Sprintf("request %q is not active", id))
	}
	delete(s.manual, id)
	s.forgetAnon(id)
	return t, nil
}

// BestWorker implements localrouterv1.LocalRouterServer: a probe, or with a
// request_id decide-and-commit (freed by Free).
func (s *Server) BestWorker(ctx context.Context, in *localrouterv1.BestWorkerRequest) (*localrouterv1.BestWorkerResponse, error) {
	// A reserving probe (reserve_ttl_us) is answered as a state-free one:
	// a subtree holds no reservations, and the parent's confirming commit
	// is an ordinary commit naming its worker.
	if in.GetRequestId() == "" || in.GetReserveTtlUs() > 0 {
		sel, err := s.probe(ctx, in.GetPrompt(), nil, in.GetConfigOverride(), in.GetAllowedAddresses())
		if err != nil {
			return nil, err
		}
		return &localrouterv1.BestWorkerResponse{Selection: sel}, nil
	}
	t, sel, err := s.commit(ctx, &localrouterv1.CommitRequest{RequestId: in.GetRequestId(), Prompt: in.GetPrompt()})
	if err != nil {
		return nil, err
	}
	if err := s.keep(ctx, in.GetRequestId(), t); err != nil {
		return nil, err
	}
	return &localrouterv1.BestWorkerResponse{Selection: selection(sel)}, nil
}

// PotentialLoads implements localrouterv1.LocalRouterServer: every worker
// rank below this router.
func (s *Server) PotentialLoads(ctx context.Context, in *localrouterv1.PotentialLoadsRequest) (*localrouterv1.PotentialLoadsResponse, error) {
	ctx, err := callContext(ctx)
	if err != nil {
		return nil, err
	}
	pr, err := prompt(in.GetPrompt(), nil)
	if err != nil {
		return nil, err
	}
	loads, err := s.st.Loads(ctx, pr)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &localrouterv1.PotentialLoadsResponse{BlockSize: uint32(pr.BlockSize)}
	if len(pr.Hashes) > 0 {
		out.RequestBlocks = uint32(len(pr.Hashes))
	}
	for _, l := range loads {
		out.Loads = append(out.Loads, &localrouterv1.PotentialLoad{WorkerId: l.WorkerID, DpRank: l.DPRank, Address: l.Address,
			PotentialPrefillTokens: uint32(l.PrefillTokens), PotentialDecodeBlocks: uint32(l.DecodeBlocks), OverlapBlocks: uint32(l.OverlapBlocks)})
	}
	return out, nil
}

// Commit implements localrouterv1.LocalRouterServer (freed by Free).
func (s *Server) Commit(ctx context.Context, in *localrouterv1.CommitRequest) (*localrouterv1.CommitResponse, error) {
	t, sel, err := s.commit(ctx, in)
	if err != nil {
		return nil, err
	}
	if err := s.keep(ctx, in.GetRequestId(), t); err != nil {
		return nil, err
	}
	return &localrouterv1.CommitResponse{Selection: selection(sel)}, nil
}

// MarkPrefillComplete implements localrouterv1.LocalRouterServer.
func (s *Server) MarkPrefillComplete(ctx context.Context, in *localrouterv1.MarkPrefillCompleteRequest) (*localrouterv1.MarkPrefillCompleteResponse, error) {
	s.mu.Lock()
	t, ok := s.manual[in.GetRequestId()]
	s.mu.Unlock()
	if !ok {
		return nil, statusOf(codes.NotFound, localrouterv1.ReasonUnknownRequest, fmt.Sprintf("request %q is not active", in.GetRequestId()))
	}
	if err := t.PrefillComplete(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &localrouterv1.MarkPrefillCompleteResponse{}, nil
}

// Free implements localrouterv1.LocalRouterServer.
func (s *Server) Free(ctx context.Context, in *localrouterv1.FreeRequest) (*localrouterv1.FreeResponse, error) {
	if in.GetReservation() {
		return nil, statusOf(codes.NotFound, localrouterv1.ReasonUnknownRequest, "a subtree holds no reservations")
	}
	t, err := s.take(in.GetRequestId())
	if err != nil {
		return nil, err
	}
	if err := t.Free(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &localrouterv1.FreeResponse{}, nil
}

// Stats implements localrouterv1.LocalRouterServer: the router's identity
// and the requests in flight through it.
func (s *Server) Stats(context.Context, *localrouterv1.StatsRequest) (*localrouterv1.StatsResponse, error) {
	return &localrouterv1.StatsResponse{RouterId: s.id, Pool: s.pool, Ready: true, ActiveRequests: uint32(s.Active())}, nil
}

// Track implements localrouterv1.LocalRouterServer: one request's
// lifecycle; the end of the stream frees it below, however it ends.
func (s *Server) Track(stream localrouterv1.LocalRouter_TrackServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	var (
		t   pool.Tracker
		sel routing.Selection
	)
	switch m := first.GetMsg().(type) {
	case *localrouterv1.TrackRequest_Commit:
		if t, sel, err = s.commit(ctx, m.Commit); err != nil {
			return err
		}
	case *localrouterv1.TrackRequest_Attach:
		if t, err = s.take(m.Attach.GetRequestId()); err != nil {
			return err
		}
	default:
		return statusOf(codes.InvalidArgument, localrouterv1.ReasonInvalidArgument, "the first Track message must be commit or attach")
	}
	defer func() { _ = t.Free(context.WithoutCancel(ctx)) }() // break means free
	return track.Serve(ctx, stream, selection(sel), t, toStatus)
}
