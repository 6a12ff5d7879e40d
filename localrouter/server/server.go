// Package server is a pool's local router as a service:
// the gRPC API of api/localrouter/v1 over a localrouter.Router, with health,
// reflection and Prometheus metrics. The process around it (flags and
// environment, etcd membership and registration, NATS KV events and
// replica sync, TLS and its client authorization, the admin listener) is
// internal/localrouterd.
//
// Errors of the router become gRPC statuses here and nowhere else: each
// carries a google.rpc.ErrorInfo whose reason is one of localrouterv1's
// Reason constants (see errorCodes for the codes).
//
// Files: server.go (Server, Options, New, Register, health; the unary
// calls BestWorker, PotentialLoads, Commit, MarkPrefillComplete, Free,
// DumpEvents, Workers, Stats and the conversions to and from the wire),
// channel.go (the Channel stream: pipelined probes, packed hashes, commits
// and events), track.go (the Track stream, ServeTrackEvents), reservettl.go
// (reserve_ttl_us read; its bound is the router's), errors.go (the router's errors as gRPC statuses), grpcopts.go
// (gRPC options), metrics.go (Metrics: RPC interceptors, gauges, counters).
package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/events"
	"github.com/kvgate/kvgate/localrouter/signals"
	"github.com/kvgate/kvgate/membership"
)

// Directory resolves worker ids to their registrations
// (registry.Watcher). Safe for concurrent use; never blocks.
type Directory interface {
	Worker(id string) (membership.WorkerInfo, bool)
	Workers() []membership.WorkerInfo
}

// Observer is told about the lifecycle changes the service made, after they
// succeeded (replica.Sync shares them with the other replicas). Its methods
// are called on the request path: they must not block, and must not retain
// localHashes.
type Observer interface {
	Added(id string, sel routing.Selection, localHashes []uint64, isl int, recorded bool)
	PrefillCompleted(id string)
	Freed(id string)
}

// Options are a Server's dependencies; only Router is required.
type Options struct {
	Router    *localrouter.Router
	Directory Directory // nil: workers have no address
	Observer  Observer  // nil: nobody is told
	// EventStats, when set, reports the KV event subscriber's counters
	// (for Stats and metrics).
	EventStats func() events.Stats
	// ScrapeStats, when set, reports the engine metrics scraper's counters,
	// and MetricsPeriod is its period (for Stats).
	ScrapeStats   func() signals.Stats
	MetricsPeriod time.Duration
	// Clock ages engine signals (default time.Now).
	Clock    func() time.Time
	RouterID string
	Pool     string
	Logger   *slog.Logger
}

// Server implements localrouterv1.LocalRouterServer over a Router.
//
// Concurrency: safe for concurrent use; every method only reads the
// router's snapshots or calls its concurrent-safe methods.
type Server struct {
	localrouterv1.UnimplementedLocalRouterServer

	r      *localrouter.Router
	opts   Options
	log    *slog.Logger
	health *health.Server

	trackStreams   atomic.Int64
	channelStreams atomic.Int64
}

var _ localrouterv1.LocalRouterServer = (*Server)(nil)

// ServiceName is the gRPC service name, also the health-check service name.
const ServiceName = "kvgate.localrouter.v1.LocalRouter"

// New returns a Server. Register it on a grpc.Server with Register.
func New(opts Options) (*Server, error) {
	if opts.Router == nil {
		return nil, fmt.Errorf("server: nil router")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	s := &Server{
		r: opts.Router, opts: opts, health: health.NewServer(),
		log: log.With("component", "localrouter.server", "pool", opts.Pool, "router_id", opts.RouterID),
	}
	s.UpdateHealth()
	return s, nil
}

// Register registers the service and the standard health service on g.
func (s *Server) Register(g *grpc.Server) {
	localrouterv1.RegisterLocalRouterServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// RegisterHealth registers the standard health service alone on g (the
// plaintext health listener, for probes that cannot do TLS).
func (s *Server) RegisterHealth(g *grpc.Server) { healthpb.RegisterHealthServer(g, s.health) }

// UpdateHealth sets the health status from the router's readiness: NOT_SERVING
// until min_initial_workers workers joined. Call it after membership changes.
func (s *Server) UpdateHealth() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.r.Ready() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// Shutdown sets every health status to NOT_SERVING for good (draining).
func (s *Server) Shutdown() { s.health.Shutdown() }

// MaxSessionKeyBytes bounds Prompt.session_key.
const MaxSessionKeyBytes = 1024

// request converts a wire Prompt to the router's Request.
func (s *Server) request(p *localrouterv1.Prompt) (localrouter.Request, error) {
	if p == nil {
		return localrouter.Request{}, localrouter.ErrEmptyRequest
	}
	req := localrouter.Request{
		Tokens: p.GetTokenIds(), LocalHashes: p.GetBlockHashes(), BlockSize: int(p.GetBlockSize()),
		ISL: int(p.GetIslTokens()), LoRAName: p.GetLoraName(), SessionKey: p.GetSessionKey(),
	}
	if len(req.SessionKey) > MaxSessionKeyBytes {
		return req, fmt.Errorf("%w: session_key of %d bytes, at most %d", errInvalidArgument, len(req.SessionKey), MaxSessionKeyBytes)
	}
	if len(req.LocalHashes) > 0 && req.BlockSize == 0 {
		return req, fmt.Errorf("%w: block_hashes need block_size (the pool's block size is %d)", errInvalidArgument, s.r.Config().BlockSize)
	}
	if len(req.LocalHashes) == 0 && len(req.Tokens) > 0 && req.BlockSize != 0 && req.BlockSize != s.r.Config().BlockSize {
		return req, fmt.Errorf("%w: request block_size %d, the pool's block size is %d", localrouter.ErrBlockSizeMismatch, req.BlockSize, s.r.Config().BlockSize)
	}
	return req, nil
}

func override(o *localrouterv1.ConfigOverride) *routing.Override {
	if o == nil {
		return nil
	}
	return &routing.Override{
		OverlapScoreCredit: o.OverlapScoreCredit,
		PrefillLoadScale:   o.PrefillLoadScale,
		RouterTemperature:  o.RouterTemperature,
	}
}

func (s *Server) address(id string) string {
	if s.opts.Directory == nil {
		return ""
	}
	info, _ := s.opts.Directory.Worker(id)
	return info.Address
}

// allow is the worker filter of BestWorkerRequest.allowed_addresses: a
// worker is admitted when its registered address is listed, or its host is
// listed without a port. Nil (no restriction) for an empty list. The set
// is as large as the list the request carried, which gRPC's message size
// bounds.
func (s *Server) allow(addrs []string) func(localrouter.WorkerKey) bool {
	if len(addrs) == 0 {
		return nil
	}
	set := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		set[strings.TrimSpace(a)] = true
	}
	return func(k localrouter.WorkerKey) bool {
		addr := s.address(k.ID)
		if addr == "" {
			return false
		}
		if set[addr] {
			return true
		}
		host, _, err := net.SplitHostPort(addr)
		return err == nil && set[host]
	}
}

// allowExcept is allow(addrs) that also refuses the workers whose
// address is in excluded (exact host:port: the global router's ejected
// workers); nil when neither list is set.
func (s *Server) allowExcept(addrs, excluded []string) func(localrouter.WorkerKey) bool {
	allow := s.allow(addrs)
	if len(excluded) == 0 {
		return allow
	}
	out := make(map[string]bool, len(excluded))
	for _, a := range excluded {
		out[strings.TrimSpace(a)] = true
	}
	return func(k localrouter.WorkerKey) bool {
		if allow != nil && !allow(k) {
			return false
		}
		addr := s.address(k.ID)
		return addr != "" && !out[addr]
	}
}

func (s *Server) selection(sel routing.Selection) *localrouterv1.Selection {
	return &localrouterv1.Selection{
		WorkerId: sel.WorkerID, DpRank: sel.DPRank, Address: s.address(sel.WorkerID),
		OverlapBlocks: uint32(sel.OverlapBlocks), RequestBlocks: uint32(sel.RequestBlocks),
		PotentialPrefillTokens: uint32(sel.PrefillTokens), PotentialDecodeBlocks: uint32(sel.DecodeBlocks),
		Cost: sel.Cost, TtftMs: sel.TTFT, ChainScore: sel.ChainScore, Candidates: uint32(sel.Candidates), BlockSize: uint32(s.r.Config().BlockSize),
		Scores: scores(sel.Scores), ReservationsHeld: uint32(sel.ReservationsHeld),
	}
}

// scores converts a choice's worker-chain scores to the wire (nil for none).
func scores(in []routing.Score) []*localrouterv1.Score {
	if len(in) == 0 {
		return nil
	}
	out := make([]*localrouterv1.Score, len(in))
	for i, sc := range in {
		out[i] = &localrouterv1.Score{Name: sc.Name, Raw: sc.Raw, Weight: sc.Weight, Contribution: sc.Contribution}
	}
	return out
}

// withSignals adds a choice's engine signals and saturation skips to out.
func (s *Server) withSignals(out *localrouterv1.Selection, rep *localrouter.SignalsReport) *localrouterv1.Selection {
	out.AllSaturated = rep.AllSaturated
	if rep.HasEngine {
		out.Engine = s.engineSignals(rep.Engine, s.r.Config().Saturation(rep.Engine))
	}
	for _, sk := range rep.Skipped {
		out.Skipped = append(out.Skipped, &localrouterv1.SkippedWorker{WorkerId: sk.Worker.ID, DpRank: sk.Worker.DPRank, Reason: sk.Reason})
	}
	return out
}

// engineSignals converts a scraped sample to the wire.
func (s *Server) engineSignals(smp signals.Sample, saturation string) *localrouterv1.EngineSignals {
	out := &localrouterv1.EngineSignals{
		Engine: smp.Engine, RunningRequests: smp.Running, WaitingRequests: smp.Waiting,
		Preemptions: smp.Preemptions, Saturation: saturation,
	}
	if smp.HasKVUsage {
		out.KvUsage = &smp.KVUsage
	}
	if smp.HasPrefixHitRate {
		out.PrefixHitRate = &smp.PrefixHitRate
	}
	if !smp.At.IsZero() {
		out.AgeSeconds = max(0, s.opts.Clock().Sub(smp.At).Seconds())
	}
	return out
}

// added tells the observer about a request recorded on sel.Worker.
func (s *Server) added(id string, req localrouter.Request, sel routing.Selection, updateIndexer bool) {
	if s.opts.Observer == nil {
		return
	}
	cfg := s.r.Config()
	local := req.LocalHashes
	isl := req.ISL
	if len(local) == 0 {
		var err error
		if local, err = kvevents.LocalHashes(req.Tokens, cfg.BlockSize, req.LoRAName); err != nil {
			return // the router accepted these tokens, so this cannot fail
		}
		if isl == 0 {
			isl = len(req.Tokens)
		}
	} else if isl == 0 {
		isl = len(local) * cfg.BlockSize
	}
	s.opts.Observer.Added(id, sel, local, isl, updateIndexer || !cfg.UseKVEvents)
}

// BestWorker implements localrouterv1.LocalRouterServer.
func (s *Server) BestWorker(ctx context.Context, in *localrouterv1.BestWorkerRequest) (*localrouterv1.BestWorkerResponse, error) {
	req, err := s.request(in.GetPrompt())
	if err != nil {
		return nil, toStatus(err)
	}
	var rep localrouter.SignalsReport
	ttl, err := reserveTTL(in.GetReserveTtlUs(), in.GetRequestId())
	if err != nil {
		return nil, toStatus(err)
	}
	sel, err := s.r.BestWorker(ctx, req, localrouter.BestWorkerOptions{
		RequestID: in.GetRequestId(), UpdateIndexer: in.GetUpdateIndexer(), Override: override(in.GetConfigOverride()),
		Signals:    &rep,
		Allow:      s.allow(in.GetAllowedAddresses()),
		ReserveTTL: ttl,
	})
	if err != nil {
		return nil, toStatus(err)
	}
	if in.GetRequestId() != "" && ttl == 0 {
		s.added(in.GetRequestId(), req, sel, in.GetUpdateIndexer())
	}
	return &localrouterv1.BestWorkerResponse{Selection: s.withSignals(s.selection(sel), &rep)}, nil
}

// PotentialLoads implements localrouterv1.LocalRouterServer.
func (s *Server) PotentialLoads(ctx context.Context, in *localrouterv1.PotentialLoadsRequest) (*localrouterv1.PotentialLoadsResponse, error) {
	req, err := s.request(in.GetPrompt())
	if err != nil {
		return nil, toStatus(err)
	}
	loads, err := s.r.PotentialLoads(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	bs := s.r.Config().BlockSize
	out := &localrouterv1.PotentialLoadsResponse{BlockSize: uint32(bs), Loads: make([]*localrouterv1.PotentialLoad, 0, len(loads))}
	if n := len(req.LocalHashes); n > 0 {
		out.RequestBlocks = uint32(n)
	} else {
		out.RequestBlocks = uint32(len(req.Tokens) / bs)
	}
	for _, l := range loads {
		pl := &localrouterv1.PotentialLoad{
			WorkerId: l.Worker.ID, DpRank: l.Worker.DPRank, Address: s.address(l.Worker.ID),
			PotentialPrefillTokens: uint32(l.PotentialPrefillTokens), PotentialDecodeBlocks: uint32(l.PotentialDecodeBlocks),
			OverlapBlocks: uint32(l.OverlapBlocks), ActiveRequests: uint32(l.ActiveRequests),
		}
		if l.HasEngine {
			pl.Engine = s.engineSignals(l.Engine, l.Saturation)
		}
		out.Loads = append(out.Loads, pl)
	}
	return out, nil
}

// commit records the request on the worker it names or, with no worker_id
// (decide-and-commit), on the worker the router chooses as BestWorker with
// a request id does: one call, so no other placement can come between the
// choice and the record. The choice follows the commit's override and is
// restricted to its allowed addresses less its excluded ones.
func (s *Server) commit(ctx context.Context, in *localrouterv1.CommitRequest) (routing.Selection, error) {
	if in.GetRequestId() == "" {
		return routing.Selection{}, localrouter.ErrEmptyRequestID
	}
	if in.GetWorkerId() == "" && in.GetDpRank() != 0 {
		return routing.Selection{}, fmt.Errorf("%w: commit names dp_rank %d but no worker_id", errInvalidArgument, in.GetDpRank())
	}
	req, err := s.request(in.GetPrompt())
	if err != nil {
		return routing.Selection{}, err
	}
	var sel routing.Selection
	if in.GetReserved() && in.GetWorkerId() == "" {
		return routing.Selection{}, fmt.Errorf("%w: commit confirms a reservation but names no worker_id", errInvalidArgument)
	}
	switch {
	case in.GetReserved():
		sel, err = s.r.Confirm(ctx, in.GetRequestId(), localrouter.WorkerKey{ID: in.GetWorkerId(), DPRank: in.GetDpRank()}, req)
	case in.GetWorkerId() == "":
		sel, err = s.r.BestWorker(ctx, req, localrouter.BestWorkerOptions{
			RequestID: in.GetRequestId(), Override: override(in.GetConfigOverride()),
			Allow: s.allowExcept(in.GetAllowedAddresses(), in.GetExcludedAddresses()),
		})
	default:
		sel, err = s.r.Commit(ctx, in.GetRequestId(), localrouter.WorkerKey{ID: in.GetWorkerId(), DPRank: in.GetDpRank()}, req)
	}
	if err != nil {
		return routing.Selection{}, err
	}
	s.added(in.GetRequestId(), req, sel, false)
	return sel, nil
}

// Commit implements localrouterv1.LocalRouterServer.
func (s *Server) Commit(ctx context.Context, in *localrouterv1.CommitRequest) (*localrouterv1.CommitResponse, error) {
	sel, err := s.commit(ctx, in)
	if err != nil {
		return nil, toStatus(err)
	}
	return &localrouterv1.CommitResponse{Selection: s.selection(sel)}, nil
}

func (s *Server) markPrefillComplete(ctx context.Context, id string) error {
	if id == "" {
		return localrouter.ErrEmptyRequestID
	}
	if err := s.r.MarkPrefillComplete(ctx, id); err != nil {
		return err
	}
	if s.opts.Observer != nil {
		s.opts.Observer.PrefillCompleted(id)
	}
	return nil
}

func (s *Server) free(ctx context.Context, id string) error {
	if id == "" {
		return localrouter.ErrEmptyRequestID
	}
	if err := s.r.Free(ctx, id); err != nil {
		return err
	}
	if s.opts.Observer != nil {
		s.opts.Observer.Freed(id)
	}
	return nil
}

// MarkPrefillComplete implements localrouterv1.LocalRouterServer.
func (s *Server) MarkPrefillComplete(ctx context.Context, in *localrouterv1.MarkPrefillCompleteRequest) (*localrouterv1.MarkPrefillCompleteResponse, error) {
	if err := s.markPrefillComplete(ctx, in.GetRequestId()); err != nil {
		return nil, toStatus(err)
	}
	return &localrouterv1.MarkPrefillCompleteResponse{}, nil
}

// Free implements localrouterv1.LocalRouterServer.
func (s *Server) Free(ctx context.Context, in *localrouterv1.FreeRequest) (*localrouterv1.FreeResponse, error) {
	if in.GetReservation() {
		if err := s.r.Release(ctx, in.GetRequestId()); err != nil {
			return nil, toStatus(err)
		}
		return &localrouterv1.FreeResponse{}, nil
	}
	if err := s.free(ctx, in.GetRequestId()); err != nil {
		return nil, toStatus(err)
	}
	return &localrouterv1.FreeResponse{}, nil
}

// DumpEvents implements localrouterv1.LocalRouterServer.
func (s *Server) DumpEvents(ctx context.Context, _ *localrouterv1.DumpEventsRequest) (*localrouterv1.DumpEventsResponse, error) {
	evs, err := s.r.DumpEvents(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	if evs == nil {
		evs = []kvevents.RouterEvent{}
	}
	b, err := json.Marshal(evs)
	if err != nil {
		return nil, toStatus(fmt.Errorf("encode dump: %w", err))
	}
	return &localrouterv1.DumpEventsResponse{EventsJson: string(b), Count: uint32(len(evs))}, nil
}

// Workers implements localrouterv1.LocalRouterServer.
func (s *Server) Workers(ctx context.Context, _ *localrouterv1.WorkersRequest) (*localrouterv1.WorkersResponse, error) {
	out := &localrouterv1.WorkersResponse{Pool: s.opts.Pool}
	byID := map[string]*localrouterv1.Worker{}
	active, ix := s.r.Active(), s.r.Index()
	for _, k := range s.r.Workers() {
		w := byID[k.ID]
		if w == nil {
			w = &localrouterv1.Worker{WorkerId: k.ID, BlockSize: uint32(s.r.Config().BlockSize)}
			if s.opts.Directory != nil {
				if info, ok := s.opts.Directory.Worker(k.ID); ok {
					w.Address, w.BlockSize, w.Model, w.Role = info.Address, uint32(info.BlockSize), info.Model, string(info.Role)
					w.KvCapacityBlocks = uint32(info.KVCapacityBlocks)
				}
			}
			byID[k.ID] = w
			out.Workers = append(out.Workers, w)
		}
		w.DpSize++
		if w.ConfigWarning == "" {
			w.ConfigWarning = s.r.ConfigWarning(k)
		}
		l := active.Load(k)
		rl := &localrouterv1.RankLoad{
			DpRank: k.DPRank, PrefillTokens: uint32(l.PrefillTokens), ActiveBlocks: uint32(l.ActiveBlocks),
			ActiveRequests: uint32(l.ActiveRequests), CachedBlocks: uint32(ix.TreeSize(k)),
		}
		if smp, ok := s.r.EngineSignals(k); ok {
			rl.Engine = s.engineSignals(smp, s.r.Config().Saturation(smp))
		}
		rl.Calibration = calibrationProto(s.r.CalibrationOf(k), s.r.TTFTChunk())
		w.Ranks = append(w.Ranks, rl)
	}
	if unread := s.unread(); len(unread) > 0 {
		// No silent knob: every worker's warning says what the router's
		// configuration leaves unread.
		for _, w := range out.Workers {
			w.ConfigWarning = strings.Join(append(nonEmpty(w.ConfigWarning), unread...), "; ")
		}
	}
	return out, nil
}

// unread lists the router's settings that take no effect, with why
// (localrouter.Config.Unread).
func (s *Server) unread() []string { return s.r.Config().Unread(s.opts.MetricsPeriod > 0) }

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// Stats implements localrouterv1.LocalRouterServer.
func (s *Server) Stats(ctx context.Context, _ *localrouterv1.StatsRequest) (*localrouterv1.StatsResponse, error) {
	cfg := s.r.Config()
	is, as := s.r.Index().Stats(), s.r.Active().Stats()
	keys := s.r.Workers()
	ids := map[string]bool{}
	for _, k := range keys {
		ids[k.ID] = true
	}
	out := &localrouterv1.StatsResponse{
		RouterId: s.opts.RouterID, Pool: s.opts.Pool, Ready: s.r.Ready(),
		Workers: uint32(len(ids)), Ranks: uint32(len(keys)), ActiveRequests: uint32(as.Requests),
		EventsApplied: is.EventsApplied, EventsRejected: is.EventsRejected, EventsUnknownWorker: s.r.UnknownWorkerEvents(),
		IndexBlocks: uint64(is.Nodes), IndexEntries: uint64(is.Entries),
		RequestsExpired: as.Expired, UnknownRequestOps: as.UnknownOps,
		Config: &localrouterv1.RouterConfig{
			BlockSize: uint32(cfg.BlockSize), OverlapScoreCredit: cfg.OverlapScoreCredit, PrefillLoadScale: cfg.PrefillLoadScale,
			RouterTemperature: cfg.RouterTemperature, UseKvEvents: cfg.UseKVEvents, TrackActiveBlocks: cfg.TrackActiveBlocks,
			ReplicaSync: cfg.ReplicaSync, TtlSeconds: cfg.TTL.Seconds(), MaxTreeSize: uint64(cfg.MaxTreeSize),
			MinInitialWorkers: uint32(cfg.MinInitialWorkers), RequestExpirySeconds: cfg.RequestExpiry.Seconds(),
			WaitingWeight: cfg.WaitingWeight, KvUsageWeight: cfg.KVUsageWeight,
			SaturationKvUsage: cfg.SaturationKVUsage, SaturationWaiting: uint32(cfg.SaturationWaiting),
			MetricsPeriodSeconds: s.opts.MetricsPeriod.Seconds(),
			TierWeights:          localrouter.FormatTierWeights(cfg.TierWeights),
			WorkerChain:          localrouter.FormatWorkerChain(chainOrDefault(cfg.WorkerChain)),
			Warnings:             s.unread(),
			Calibrate:            cfg.Calibrate,
		},
		SaturationSkips: s.r.SaturationSkips(),
	}
	if s.opts.ScrapeStats != nil {
		ss := s.opts.ScrapeStats()
		out.MetricsScrapes, out.MetricsScrapeFailures = ss.Scrapes, ss.Failures
	}
	if s.opts.EventStats != nil {
		es := s.opts.EventStats()
		out.EventGaps, out.Dumps = es.Gaps, es.Dumps
	}
	return out, nil
}

// chainOrDefault is chain, or the default chain when it is empty.
func chainOrDefault(chain []localrouter.ScorerSpec) []localrouter.ScorerSpec {
	if len(chain) == 0 {
		return localrouter.DefaultWorkerChain()
	}
	return chain
}

// calibrationProto is a rank's timing model on the wire.
func calibrationProto(c localrouter.WorkerCalibration, chunk int) *localrouterv1.Calibration {
	src := "prior"
	switch {
	case c.Pinned:
		src = "pinned"
	case c.Fitted:
		src = "fitted"
	}
	m := c.Model
	return &localrouterv1.Calibration{
		Source: src, Samples: c.Samples, MinSamples: localrouter.CalibrationMinSamples, Error: c.Error,
		PrefillQuad: m.PrefillQuad, PrefillLinear: m.PrefillLinear, PrefillFixed: m.PrefillFixed,
		DecodeQuad: m.DecodeQuad, DecodeLinear: m.DecodeLinear, DecodeFixed: m.DecodeFixed, QueueMs: m.QueueMs,
		PrefillQuadFactor: c.PrefillQuadFactor, PrefillLinearFactor: c.PrefillLinearFactor, DecodeFactor: c.DecodeFactor,
		PrefillChunkMs: m.Prefill(chunk), PoolSamples: c.PoolSamples, Speed: c.Speed, SpeedRaw: c.SpeedRaw,
		Histograms: c.Histograms, HistogramSamples: c.HistogramSamples, EngineTtftMs: c.EngineTTFTMs, EngineItlMs: c.EngineITLMs,
		EngineQueueMs: c.EngineQueueMs, EnginePrefillMs: c.EnginePrefillMs, EngineDecodeMs: c.EngineDecodeMs,
	}
}
