package extproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/lib/config"
)

// Server is the ExternalProcessor service. It is safe for concurrent use:
// each ext_proc stream runs its own state machine and shares only the
// Decider, the configuration and the metrics.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg     Config
	decider globalrouter.Decider
	log     *slog.Logger
	m       *metrics
	paths   map[string]bool
	health  *health.Server
	// reqMode and respMode are the configured body modes, for streams
	// whose first message carries no protocol_config.
	reqMode, respMode bodyMode
	// open counts admitted streams (MaxStreams); lastRefusalLog rate-limits
	// the log of bounds' refusals (bounds.go).
	open           atomic.Int64
	lastRefusalLog atomic.Int64
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// New returns a Server that routes with decider. cfg is completed with
// Defaults and validated; the metrics are registered on reg (nil means a
// private registry); logger may be nil.
func New(cfg Config, decider globalrouter.Decider, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if decider == nil {
		return nil, errors.New("extproc: nil decider")
	}
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("extproc: config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("extproc: metrics: %w", err)
	}
	s := &Server{
		cfg:      cfg,
		decider:  decider,
		log:      logger.With("component", "extproc"),
		m:        m,
		paths:    map[string]bool{},
		health:   health.NewServer(),
		reqMode:  bodyModeOf(cfg.RequestBodyMode),
		respMode: bodyModeOf(cfg.ResponseBodyMode),
	}
	if cfg.HeaderFallbacks {
		s.log.Warn("extproc.Config.HeaderFallbacks is set but ignored: the x-gateway-destination-endpoint header always carries the same ordered list as the envoy.lb metadata (the endpoint-picker protocol forbids different values)")
	}
	for _, p := range cfg.InferencePaths {
		s.paths[p] = true
	}
	return s, nil
}

// Config returns the server's effective configuration.
func (s *Server) Config() Config { return s.cfg }

// Register adds the ExternalProcessor service, gRPC health and reflection
// to g. Health answers for the endpoint-picker protocol's services:
// "liveness" (and "") serving while the process serves; "readiness" and
// envoy.service.ext_proc.v3.ExternalProcessor serving when the Decider is
// ready (a globalrouter.Router: its configuration loaded and a pool
// reachable), refreshed every ReadinessInterval by Serve.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	reflection.Register(g)
	s.RegisterHealth(g)
}

// RegisterHealth adds only the gRPC health service, with the statuses
// Register describes, to g: for a health port of its own (a plaintext one
// the kubelet's gRPC probe can reach when the ext_proc port runs TLS). The
// statuses are shared with every server it was registered on; Serve keeps
// readiness fresh.
func (s *Server) RegisterHealth(g *grpc.Server) {
	healthpb.RegisterHealthServer(g, s.health)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.setHealth()
}

// Serve runs a gRPC server with the service on lis (receiving messages up
// to MaxBodyBytes and 1 MiB more) until ctx is done, then
// marks itself not serving and stops gracefully within ShutdownTimeout
// (then forcibly). It returns nil after a stop caused by ctx.
func (s *Server) Serve(ctx context.Context, lis net.Listener, opts ...grpc.ServerOption) error {
	// A BUFFERED body arrives as one message: let it be as large as the
	// cap (and a little more, so the cap answers 413, not gRPC).
	opts = append(transportOptions(s.cfg.MaxBodyBytes+1<<20), opts...)
	g := grpc.NewServer(opts...)
	s.Register(g)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	hctx, stopHealth := context.WithCancel(ctx)
	healthDone := make(chan struct{})
	go func() { defer close(healthDone); s.watchHealth(hctx) }()
	defer func() { stopHealth(); <-healthDone }()
	s.log.Info("ext_proc server listening", "addr", lis.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("extproc: serve: %w", err)
	case <-ctx.Done():
	}
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	t := time.NewTimer(s.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		g.Stop()
		<-stopped
	}
	<-errc
	return nil
}

// ListenAndServe listens on cfg.Addr and Serves.
func (s *Server) ListenAndServe(ctx context.Context, opts ...grpc.ServerOption) error {
	lis, err := net.Listen("tcp", config.ListenAddr(s.cfg.Addr))
	if err != nil {
		return fmt.Errorf("extproc: %w", err)
	}
	return s.Serve(ctx, lis, opts...)
}

// trustHeader is the header that carries a caller's trust token, removed
// from every request before it goes upstream: the Decider's when it says
// (globalrouter.Router does), globalrouter.DefaultTrustHeader otherwise.
func (s *Server) trustHeader() string {
	if t, ok := s.decider.(interface{ TrustHeader() string }); ok {
		if h := t.TrustHeader(); h != "" {
			return h
		}
	}
	return globalrouter.DefaultTrustHeader
}

// Process runs one ext_proc stream: one HTTP request and its response.
// Past MaxStreams open streams a new one is refused with
// RESOURCE_EXHAUSTED; with a request or idle timeout set the stream runs
// under the bounds bounds.go describes.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	if !s.admit() {
		s.noteRefusal(refusedMaxStreams)
		return status.Errorf(codes.ResourceExhausted, "ext_proc: %d streams open (-max-streams)", s.cfg.MaxStreams)
	}
	s.m.streams.Inc()
	release := func() { s.m.streams.Dec(); s.release() }
	x := newExchange(s, stream)
	if s.bounded() {
		return x.runBounded(release)
	}
	defer release()
	defer x.finish()
	return x.run()
}

// transportWindow fixes the server's HTTP/2 receive windows. A set window
// turns off grpc-go's bandwidth-delay-product estimation, whose PING frames
// otherwise ride along every request body (Envoy probes nothing either: its
// windows are a fixed 256 MiB by default): fewer frames and syscalls per
// request. 1 MiB is a credit, not a buffer: the server reads as it goes.
const transportWindow = 1 << 20

// transportOptions are the ext_proc server's gRPC transport settings.
//   - Keepalive pings: an ext_proc stream lasts as long as its HTTP request
//     (a whole generation), so an Envoy that vanished without a FIN must not
//     hold its requests' load until the kernel gives up; the pings end its
//     streams within 30 s, and ending a stream frees its request.
//   - A lenient ping policy: Envoy's connection_keepalive may ping as often
//     as every second (grpc-go's default policy, 5 minutes, would answer a
//     GOAWAY to any shorter interval, dropping every stream on the
//     connection).
//   - Fixed windows (transportWindow), stream workers reused across streams
//     (their stacks already grown: a decision's call path is deep), and the
//     receive bound, maxRecv.
func transportOptions(maxRecv int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecv),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.InitialWindowSize(transportWindow),
		grpc.InitialConnWindowSize(transportWindow),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
}
