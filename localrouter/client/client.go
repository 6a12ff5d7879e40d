// Package client is the Go client of a pool's local router service
// (api/localrouter/v1), and the project's only one (package pool wraps
// it): the same calls as localrouter.Router over gRPC, a Track handle for
// a request's lifecycle, and Generate, which routes a prompt, runs it on
// the chosen worker's OpenAI-compatible /v1/completions and tracks it
// (Dynamo's KvRouter.generate). Answers are routing.Selection
// (api/routing); overrides routing.Override.
//
// Three commits, named for what they wait for: Commit records a placed
// request and waits for the answer (no stream: Free it or it expires);
// Track does the same over a lifecycle stream bound to its context; and
// CommitAsync sends the commit on a lifecycle stream without waiting (the
// pipelined commit the global router uses: its answer goes to a listener,
// the stream outlives the context and ends with AsyncTracker.Free).
//
// The four ways to use it (docs/localrouter.md) are the package examples:
// automatic routing (Generate), manual lifecycle (BestWorker with a request
// id, MarkPrefillComplete, Free), hierarchical probing of several routers
// (BestWorker without a request id, then Commit on the best), and custom
// routing on PotentialLoads (Generate with a forced worker).
//
// Files: client.go (Client, Dial, New, options), generate.go (Generate:
// route, stream, free), sse.go (the engine's SSE stream), track.go
// (Tracker: the lifecycle stream), async.go (CommitAsync, AsyncTracker),
// channel.go (Channel: the probe channel), errors.go (Error, gRPC status).
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/signals"
)

var (
	contextCanceled = context.Canceled
	contextDeadline = context.DeadlineExceeded
)

// Client calls one local router. Safe for concurrent use.
type Client struct {
	conn   *grpc.ClientConn // nil when the caller owns the connection
	state  connState        // the connection's state, when it tells it
	target string           // for errors
	rpc    localrouterv1.LocalRouterClient
	http   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client Generate uses to reach workers
// (default http.DefaultClient).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// Dial returns a Client of the router at target (host:port, or any gRPC
// target). With no dialOpts it uses plaintext gRPC with keepalive pings;
// dialOpts replace those defaults. Close it.
func Dial(target string, dialOpts []grpc.DialOption, opts ...Option) (*Client, error) {
	if len(dialOpts) == 0 {
		dialOpts = []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			// Find a router that vanished without closing the connection.
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
			// Fixed windows: no bandwidth-estimation pings riding along
			// each small call.
			grpc.WithInitialWindowSize(1 << 20),
			grpc.WithInitialConnWindowSize(1 << 20),
		}
	}
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("local router %s: %w", target, err)
	}
	c := New(conn, opts...)
	c.conn, c.target = conn, target
	return c, nil
}

// New returns a Client over a connection the caller owns.
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	c := &Client{rpc: localrouterv1.NewLocalRouterClient(conn), http: http.DefaultClient}
	c.state, _ = conn.(connState)
	if cc, ok := conn.(*grpc.ClientConn); ok {
		c.target = cc.Target()
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Close closes the connection Dial opened.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Prompt is a request's prompt as the router sees it: token ids, or the
// local block hashes (kvevents.LocalHashes) computed for BlockSize, which
// must be the pool's. Hashes are what a caller that already hashed sends.
type Prompt struct {
	Tokens      []uint32
	BlockHashes []uint64
	BlockSize   int
	// ISL is the prompt length in tokens (default: len(Tokens), or
	// len(BlockHashes)*BlockSize).
	ISL      int
	LoRAName string
	// SessionKey is the request's session ("" for none), for the pool's
	// worker chain's session scorer.
	SessionKey string
}

// TokenPrompt is a Prompt of token ids.
func TokenPrompt(tokens []uint32) Prompt { return Prompt{Tokens: tokens} }

// HashPrompt is a Prompt of local block hashes computed for blockSize.
func HashPrompt(hashes []uint64, blockSize int) Prompt {
	return Prompt{BlockHashes: hashes, BlockSize: blockSize}
}

// proto is the wire prompt: the hashes when there are some (the router
// prefers them), else the tokens.
func (p Prompt) proto() *localrouterv1.Prompt {
	out := &localrouterv1.Prompt{
		BlockHashes: p.BlockHashes, BlockSize: uint32(p.BlockSize),
		IslTokens: uint32(p.ISL), LoraName: p.LoRAName, SessionKey: p.SessionKey,
	}
	if len(p.BlockHashes) == 0 {
		out.TokenIds = p.Tokens
	}
	return out
}

// isl is the prompt length the router will assume (see Prompt.ISL).
func (p Prompt) isl() int {
	switch {
	case p.ISL > 0:
		return p.ISL
	case len(p.BlockHashes) > 0:
		return len(p.BlockHashes) * p.BlockSize
	}
	return len(p.Tokens)
}

// selection converts the wire answer; isl is the prompt length the caller
// sent (the answer does not repeat it).
func selection(s *localrouterv1.Selection, isl int) routing.Selection {
	out := routing.Selection{
		WorkerID: s.GetWorkerId(), DPRank: s.GetDpRank(), Address: s.GetAddress(),
		OverlapBlocks: int(s.GetOverlapBlocks()), RequestBlocks: int(s.GetRequestBlocks()),
		PrefillTokens: int(s.GetPotentialPrefillTokens()), DecodeBlocks: int(s.GetPotentialDecodeBlocks()),
		Cost: s.GetCost(), TTFT: s.GetTtftMs(), ChainScore: s.GetChainScore(), Candidates: int(s.GetCandidates()), BlockSize: int(s.GetBlockSize()), ISL: isl,
		AllSaturated: s.GetAllSaturated(), ReservationsHeld: int(s.GetReservationsHeld()),
	}
	if out.ISL == 0 {
		out.ISL = out.RequestBlocks * out.BlockSize
	}
	if sc := s.GetScores(); len(sc) > 0 {
		out.Scores = make([]routing.Score, len(sc))
		for i, v := range sc {
			out.Scores[i] = routing.Score{Name: v.GetName(), Raw: v.GetRaw(), Weight: v.GetWeight(), Contribution: v.GetContribution()}
		}
	}
	return out
}

// BestWorkerOptions select what BestWorker does besides choosing.
type BestWorkerOptions struct {
	// RequestID, when set, records the request on the chosen worker; the
	// caller must then call MarkPrefillComplete and Free. Empty: a pure
	// query.
	RequestID string
	// UpdateIndexer records the choice in the approximate index.
	UpdateIndexer bool
	// Override changes cost parameters for this request.
	Override *routing.Override
	// Signals, when set, receives the chosen rank's engine signals and the
	// ranks skipped for engine saturation (when the router scrapes its
	// workers' metrics).
	Signals *SignalsReport
	// AllowedAddresses, when not empty, restricts the choice to the
	// workers at these host:port addresses (or hosts, without a port);
	// none of them in the pool: an error wrapping
	// routing.ErrNoAllowedWorker. A router older than the field
	// ignores it: callers check the answer's Address.
	AllowedAddresses []string
	// ReserveTTL, with RequestID, makes the call a reserving probe: the
	// chosen worker is held for the request for ReserveTTL (its load
	// counted by every later choice, the KV index untouched) instead of
	// the request being recorded. A commit with CommitOptions.Reserved
	// confirms it; Release (or the TTL) releases it. A router older than
	// the field records the request instead: callers that reserve must
	// know their routers.
	ReserveTTL time.Duration
}

// ttlMicros is d in whole microseconds, at least 1 when d > 0.
func ttlMicros(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(max(d.Microseconds(), 1), math.MaxUint32))
}

func overrideProto(o *routing.Override) *localrouterv1.ConfigOverride {
	if o == nil {
		return nil
	}
	return &localrouterv1.ConfigOverride{
		OverlapScoreCredit: o.OverlapScoreCredit, PrefillLoadScale: o.PrefillLoadScale, RouterTemperature: o.RouterTemperature,
	}
}

// BestWorker asks the router for the best worker for p.
func (c *Client) BestWorker(ctx context.Context, p Prompt, o BestWorkerOptions) (routing.Selection, error) {
	r, err := c.rpc.BestWorker(ctx, &localrouterv1.BestWorkerRequest{
		Prompt: p.proto(), ConfigOverride: overrideProto(o.Override), RequestId: o.RequestID, UpdateIndexer: o.UpdateIndexer,
		AllowedAddresses: o.AllowedAddresses, ReserveTtlUs: ttlMicros(o.ReserveTTL),
	})
	if err != nil {
		return routing.Selection{}, fromStatus(err)
	}
	if o.Signals != nil {
		*o.Signals = signalsReport(r.GetSelection())
	}
	return selection(r.GetSelection(), p.isl()), nil
}

// signalsReport converts the engine-signal side of a wire answer.
func signalsReport(s *localrouterv1.Selection) SignalsReport {
	rep := SignalsReport{AllSaturated: s.GetAllSaturated()}
	if e := s.GetEngine(); e != nil {
		rep.Engine, rep.HasEngine = engineSample(e), true
	}
	for _, sk := range s.GetSkipped() {
		rep.Skipped = append(rep.Skipped, Skip{Worker: routing.WorkerKey{ID: sk.GetWorkerId(), DPRank: sk.GetDpRank()}, Reason: sk.GetReason()})
	}
	return rep
}

// engineSample converts the wire's engine signals back to a sample (At is
// now less the reported age).
func engineSample(e *localrouterv1.EngineSignals) signals.Sample {
	return signals.Sample{
		Engine: e.GetEngine(), Running: e.GetRunningRequests(), Waiting: e.GetWaitingRequests(),
		KVUsage: e.GetKvUsage(), HasKVUsage: e.KvUsage != nil, Preemptions: e.GetPreemptions(),
		PrefixHitRate: e.GetPrefixHitRate(), HasPrefixHitRate: e.PrefixHitRate != nil,
		At: time.Now().Add(-time.Duration(e.GetAgeSeconds() * float64(time.Second))),
	}
}

// PotentialLoad is one worker rank's load if the prompt were placed there.
type PotentialLoad struct {
	Worker routing.WorkerKey
	// Address is the worker's host:port.
	Address string
	// PotentialPrefillTokens: this request's uncached tokens plus the
	// prefill tokens of the worker's requests still in prefill.
	PotentialPrefillTokens int
	// PotentialDecodeBlocks: the worker's distinct active blocks plus this
	// request's blocks not already active there.
	PotentialDecodeBlocks int
	OverlapBlocks         int
	ActiveRequests        int
	// Engine is the rank's engine signals, when its metrics are scraped
	// (HasEngine); Saturation says why BestWorker would skip it ("" when
	// it would not).
	Engine     signals.Sample
	HasEngine  bool
	Saturation string
}

// SignalsReport is the engine-signal side of a BestWorker answer, as the
// wire carries it (routing.SignalsReport).
type SignalsReport = routing.SignalsReport

// Skip is a rank BestWorker left out, and why (routing.Skip).
type Skip = routing.Skip

// PotentialLoads returns every worker rank's potential load for p.
func (c *Client) PotentialLoads(ctx context.Context, p Prompt) ([]PotentialLoad, error) {
	r, err := c.rpc.PotentialLoads(ctx, &localrouterv1.PotentialLoadsRequest{Prompt: p.proto()})
	if err != nil {
		return nil, fromStatus(err)
	}
	out := make([]PotentialLoad, 0, len(r.GetLoads()))
	for _, l := range r.GetLoads() {
		out = append(out, PotentialLoad{Address: l.GetAddress(),
			Worker:                 routing.WorkerKey{ID: l.GetWorkerId(), DPRank: l.GetDpRank()},
			PotentialPrefillTokens: int(l.GetPotentialPrefillTokens()), PotentialDecodeBlocks: int(l.GetPotentialDecodeBlocks()),
			OverlapBlocks: int(l.GetOverlapBlocks()), ActiveRequests: int(l.GetActiveRequests()),
		})
		if e := l.GetEngine(); e != nil {
			last := &out[len(out)-1]
			last.Engine, last.HasEngine, last.Saturation = engineSample(e), true, e.GetSaturation()
		}
	}
	return out, nil
}

// CommitOptions bound a commit without a worker (decide-and-commit: the
// router chooses the worker and records the request there in one step);
// a commit naming its worker ignores them. A router older than these
// fields ignores them: callers check the answer's Address.
type CommitOptions struct {
	// Override changes cost parameters for the choice.
	Override *routing.Override
	// AllowedAddresses restricts the choice as BestWorkerOptions'.
	AllowedAddresses []string
	// ExcludedAddresses are workers (host:port, exactly) never chosen
	// (a caller's passive health ejected them). None left: an error
	// wrapping routing.ErrNoAllowedWorker.
	ExcludedAddresses []string
	// Reserved confirms the reservation the request's reserving probe
	// made on this router (BestWorkerOptions.ReserveTTL): a commit naming
	// its worker, which the router records by turning the reservation
	// into the request (CommitRequest.reserved). Unlike the fields above
	// it applies to commits naming their worker only.
	Reserved bool
	// Unanswered, with Reserved, lets a channel whose router takes them
	// (its hello's confirms) send the confirmation as
	// ChannelRequest.confirm: the request id and the worker only, never
	// answered (committed is not called), its reservation holding the
	// request's load and blocks. A confirmation whose reservation is gone
	// (expired, or released by a broken stream) is then dropped and
	// counted by the router, not recorded as an ordinary commit: set it
	// when the reservation is surely held (well within its TTL, on the
	// stream that probed). Elsewhere (unary calls, an older router) the
	// confirmation is the answered commit.
	Unanswered bool
}

func commitProto(id string, worker routing.WorkerKey, p Prompt, o CommitOptions) *localrouterv1.CommitRequest {
	r := &localrouterv1.CommitRequest{RequestId: id, WorkerId: worker.ID, DpRank: worker.DPRank, Prompt: p.proto(), Reserved: o.Reserved && worker.ID != ""}
	if worker.ID == "" {
		r.ConfigOverride, r.AllowedAddresses, r.ExcludedAddresses = overrideProto(o.Override), o.AllowedAddresses, o.ExcludedAddresses
	}
	return r
}

// Commit records request id, placed by the caller on worker, and waits for
// the router's answer. No stream is opened: the caller frees the request
// (Free) or it expires. Track is the same commit with a lifecycle stream;
// CommitAsync the pipelined one.
func (c *Client) Commit(ctx context.Context, id string, worker routing.WorkerKey, p Prompt) (routing.Selection, error) {
	r, err := c.rpc.Commit(ctx, commitProto(id, worker, p, CommitOptions{}))
	if err != nil {
		return routing.Selection{}, fromStatus(err)
	}
	return selection(r.GetSelection(), p.isl()), nil
}

// MarkPrefillComplete marks request id's first token.
func (c *Client) MarkPrefillComplete(ctx context.Context, id string) error {
	_, err := c.rpc.MarkPrefillComplete(ctx, &localrouterv1.MarkPrefillCompleteRequest{RequestId: id})
	return fromStatus(err)
}

// Release releases the reservation request id's reserving probe made
// (BestWorkerOptions.ReserveTTL) and waits for the answer; none held
// (expired, confirmed, released) is an error wrapping
// routing.ErrUnknownRequest.
func (c *Client) Release(ctx context.Context, id string) error {
	_, err := c.rpc.Free(ctx, &localrouterv1.FreeRequest{RequestId: id, Reservation: true})
	return fromStatus(err)
}

// Free forgets request id on the router (the manual lifecycle).
func (c *Client) Free(ctx context.Context, id string) error {
	_, err := c.rpc.Free(ctx, &localrouterv1.FreeRequest{RequestId: id})
	return fromStatus(err)
}

// DumpEvents returns the router's KV index as events.
func (c *Client) DumpEvents(ctx context.Context) ([]kvevents.RouterEvent, error) {
	r, err := c.rpc.DumpEvents(ctx, &localrouterv1.DumpEventsRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	var evs []kvevents.RouterEvent
	if err := json.Unmarshal([]byte(r.GetEventsJson()), &evs); err != nil {
		return nil, fmt.Errorf("local router dump: %w", err)
	}
	return evs, nil
}

// Workers returns the pool's members and their loads.
func (c *Client) Workers(ctx context.Context) ([]*localrouterv1.Worker, error) {
	r, err := c.rpc.Workers(ctx, &localrouterv1.WorkersRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	return r.GetWorkers(), nil
}

// Stats returns the router's counters.
func (c *Client) Stats(ctx context.Context) (*localrouterv1.StatsResponse, error) {
	r, err := c.rpc.Stats(ctx, &localrouterv1.StatsRequest{})
	return r, fromStatus(err)
}

// errTrackerDone is returned by a Tracker used after its request was freed.
var errTrackerDone = errors.New("tracked request already freed")
