// Package up runs the whole of kvgate in one process for `kvgate up` (`make
// run`) and for the end-to-end tests: an embedded etcd and NATS, pools of
// mock workers (mocker) each with its local router, the global router
// (globalrouter) behind the ext_proc server (extproc), and the
// Envoy-faithful gateway (envoy/gateway) in front, with a status page
// (/kvgate/) and the live one (internal/status, /kvgate/status/).
//
// Everything listens on loopback; every address but the gateway's, the
// admin listener's and the ext_proc server's is picked by the kernel (port
// 0), and System reports them, so a real Envoy or a gRPC client can be
// pointed at the parts.
//
// The gateway is the public surface: it forwards only the client APIs
// (PublicPaths; GET /v1/models/{id}; the ext_proc server's configured
// inference paths: OpenAI's completions, chat and Responses, Anthropic's
// Messages) and answers 404 for anything else, so no client reaches a worker's
// /reset_prefix_cache or /metrics. The status page, status.json and the
// metrics are on the admin listener (AdminURL), never on the gateway.
//
// Files: up.go (Start, readiness, Close, Run), config.go (Config,
// PoolSpec, DefaultConfig), system.go (System, Pool and what they expose:
// addresses, loads, Summary), worker.go (a mock worker), embedded.go (the
// embedded etcd), secure.go (the certificates of --secure-serving),
// regions.go (the region routers of TopologyRegions), disaggregated.go
// (the prefill and decode pools of TopologyDisaggregated), faults.go (stopping
// and restarting parts, for tests), accounting.go (the routers' in-flight
// count against the engines' running+waiting, sampled and compared
// within a window), public.go (the gateway's public
// paths), status.go (the status page), live.go (the live page's
// snapshot), tokenizer.go (the tokenizers it loads).
package up

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/envoy/gateway"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/embedded"
	"github.com/kvgate/kvgate/internal/localrouterd"
	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/status"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/pool"
)

// ReadyTimeout bounds how long Start waits for the parts to see each other.
const ReadyTimeout = 30 * time.Second

// Start brings the whole system up and returns once a request can be
// routed: every local router sees its workers and the global router sees
// every local router. ctx bounds the start only; Close stops everything.
func Start(ctx context.Context, cfg Config) (_ *System, err error) {
	cfg.defaults()
	s := &System{cfg: cfg, log: cfg.Logger.With("component", "up"), started: time.Now(), Registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Close(cctx)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	switch cfg.Topology {
	case "", TopologyFlat:
	case TopologyDisaggregated:
		if err := checkDisaggregated(cfg.Pools); err != nil {
			return nil, err
		}
	case TopologyRegions:
		if cfg.SecureServing {
			return nil, fmt.Errorf("topology %s: secure serving is not supported (the region routers serve their subtrees in plaintext)", TopologyRegions)
		}
	default:
		return nil, fmt.Errorf("topology %q: want %s, %s or %s", cfg.Topology, TopologyFlat, TopologyRegions, TopologyDisaggregated)
	}

	var sec *secure
	if cfg.SecureServing {
		if sec, err = newSecure(cfg.Host); err != nil {
			return nil, err
		}
		s.tlsDir, s.CAFile, s.ClientCertFile, s.ClientKeyFile = sec.dir, sec.caFile, sec.cliCert, sec.cliKey
	}
	if s.etcd, err = startEtcd(ctx, cfg.Host); err != nil {
		return nil, err
	}
	if s.nats, err = embedded.StartNATS(cfg.Host); err != nil {
		return nil, err
	}
	if s.nc, err = (runner.NATS{URL: s.nats.URL()}).Connect("kvgate-up", cfg.Logger); err != nil {
		return nil, err
	}

	tok, err := loadTokenizer(cfg.Model, cfg.Logger)
	if err != nil {
		return nil, err
	}
	shared := tok

	var pools []pool.Config
	for _, ps := range cfg.Pools {
		p := &Pool{Name: ps.Name, Role: ps.Role, Registry: prometheus.NewRegistry()}
		if p.Role == "" {
			p.Role = membership.RoleAggregated
		}
		s.Pools = append(s.Pools, p)
		rc := localrouterd.DefaultConfig()
		rc.Pool = ps.Name
		rc.RouterID = ps.Name + "-router"
		rc.GRPCAddr = net.JoinHostPort(cfg.Host, "0")
		rc.MetricsAddr = ""
		rc.Etcd = s.etcd.endpoints
		rc.NATS = s.nats.URL()
		rc.RegisterTTL = 5 * time.Second
		rc.Router.BlockSize = cfg.BlockSize
		rc.Router.WorkerChain = ps.WorkerChain
		rc.Router.Scorers = cfg.Scorers
		rc.MetricsPeriod = max(cfg.MetricsPeriod, 0)
		if sec != nil {
			rc.TLS = sec.routerServer
			rc.AuthorizedClients = []string{secureClientName}
		}
		p.rcfg, p.log = rc, cfg.Logger
		if p.Router, err = localrouterd.Start(ctx, rc, localrouterd.Deps{Logger: cfg.Logger, Registry: p.Registry}); err != nil {
			return nil, fmt.Errorf("pool %s: local router: %w", ps.Name, err)
		}
		if cfg.Observers.Router != nil {
			p.obs = cfg.Observers.Router(ps.Name)
			p.observeRouter()
		}
		for i := range ps.Workers {
			w, err := startWorker(ctx, workerSpec{
				pool: ps.Name, id: fmt.Sprintf("%s-w%d", ps.Name, i), host: cfg.Host, model: cfg.Model, dpSize: ps.dpSize(i),
				engine:  mocker.Config{BlockSize: cfg.BlockSize, NumBlocks: cfg.NumBlocks, MaxNumSeqs: cfg.MaxNumSeqs, Speedup: cfg.Speedup, Role: ps.Role},
				tok:     shared,
				maxBody: int64(cfg.MaxBodyBytes),
				obs:     cfg.Observers.Engine,
			}, s.nc, s.etcd.cli, cfg.Logger)
			if err != nil {
				return nil, fmt.Errorf("pool %s: %w", ps.Name, err)
			}
			p.Workers = append(p.Workers, w)
		}
		pc := pool.NewConfig(ps.Name, cfg.BlockSize, []string{cfg.Model})
		pc.Routers = pool.Routers{Etcd: true}
		pc.WorkerChain = ps.WorkerChain
		if ps.Role != "" {
			pc.Role = ps.Role
		}
		pools = append(pools, pc)
	}
	if cfg.Topology == TopologyRegions {
		region := func(reg prometheus.Registerer) []globalrouter.Option {
			return []globalrouter.Option{globalrouter.WithEtcd(s.etcd.cli), globalrouter.WithLogger(cfg.Logger),
				globalrouter.WithRegisterer(reg), globalrouter.WithTokenizer(cfg.Model, shared)}
		}
		if pools, err = s.startRegions(ctx, pools, region); err != nil {
			return nil, err
		}
	}
	gcfg := globalrouter.DefaultConfig(pools...)
	s.probeTimeout(&gcfg)
	gcfg.Models = []globalrouter.ModelConfig{{Name: cfg.Model, Tokenizer: globalrouter.DefaultTokenizer, MaxBodyBytes: cfg.MaxBodyBytes}}
	// A local demo: its one user is the operator, who pins and reads the
	// routing headers (production configurations default to neither). A
	// gateway bound beyond loopback serves others: trusted callers only.
	if loopbackAddr(cfg.GatewayAddr) {
		gcfg.Trust.Steering, gcfg.Trust.RoutingHeaders = globalrouter.AccessOn, globalrouter.AccessOn
	}
	gcfg.Tenancy, gcfg.Trust.TokensSHA256 = cfg.Tenancy, cfg.TrustTokensSHA256
	if cfg.Chain != nil {
		gcfg.Chain = cfg.Chain
	}
	gcfg.FlowControl = cfg.FlowControl // globalrouter.New applies its defaults and validates it
	s.Decisions = status.NewRecorder(20)
	gopts := []globalrouter.Option{
		globalrouter.WithObserver(s.observeDecision),
		globalrouter.WithTracerProvider(cfg.TracerProvider),
		globalrouter.WithEtcd(s.etcd.cli),
		globalrouter.WithLogger(cfg.Logger),
		globalrouter.WithRegisterer(s.Registry),
		globalrouter.WithTokenizer(cfg.Model, shared),
	}
	if cfg.Observers.Freed != nil {
		gopts = append(gopts, globalrouter.WithFreeObserver(cfg.Observers.Freed))
	}
	var xopts []grpc.ServerOption
	xclient := insecure.NewCredentials()
	if sec != nil {
		gopts = append(gopts, globalrouter.WithDialer(pool.ChannelDialer(grpc.WithTransportCredentials(sec.routerClient))))
		xopts = append(xopts, grpc.Creds(sec.extprocServer))
		xclient = sec.extprocClient
	}
	if s.Global, err = globalrouter.New(gcfg, append(gopts, cfg.GlobalOptions...)...); err != nil {
		return nil, err
	}

	xcfg := cfg.Extproc
	xcfg.Addr = cfg.ExtprocAddr
	if xcfg.MaxBodyBytes == 0 {
		xcfg.MaxBodyBytes = cfg.MaxBodyBytes
	}
	xsrv, err := extproc.New(xcfg, s.Global, cfg.Logger, s.Registry)
	if err != nil {
		return nil, err
	}
	xlis, err := net.Listen("tcp", config.ListenAddr(cfg.ExtprocAddr))
	if err != nil {
		return nil, fmt.Errorf("ext_proc: %w", err)
	}
	s.extprocAddr = xlis.Addr().String()
	xctx, xstop := context.WithCancel(context.Background())
	s.extprocStop, s.extprocDone = xstop, make(chan error, 1)
	go func() { s.extprocDone <- xsrv.Serve(xctx, xlis, xopts...) }()
	s.Live = status.New(status.Options{Source: s.liveSnapshot, Recorder: s.Decisions})

	if s.conn, err = grpc.NewClient(s.extprocAddr, append(extprocclient.DialOptions(), grpc.WithTransportCredentials(xclient))...); err != nil {
		return nil, fmt.Errorf("ext_proc client: %w", err)
	}
	gcfgw, err := gateway.DefaultConfig()
	if err != nil {
		return nil, err
	}
	// Pass-through requests (GET /v1/models) go to a worker, as an Envoy
	// route of their own would send them.
	for i, p := range s.Pools {
		if len(p.Workers) > 0 && cfg.Pools[i].Role != membership.RolePrefill {
			gcfgw.DefaultUpstream = p.Workers[0].Addr
			break
		}
	}
	gcfgw.UpstreamHTTP2 = cfg.UpstreamHTTP2
	gcfgw.MaxRequestHeadersBytes, gcfgw.BodyTimeout = cfg.GatewayMaxHeaderBytes, cfg.GatewayBodyTimeout
	if s.gw, err = gateway.New(s.conn, gcfgw, cfg.Logger); err != nil {
		return nil, err
	}
	glis, err := net.Listen("tcp", config.ListenAddr(cfg.GatewayAddr))
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	s.gatewayAddr = glis.Addr().String()
	s.gatewayHTTP = &http.Server{Handler: publicOnly(s.gw, xcfg.Defaults().InferencePaths), ReadHeaderTimeout: 10 * time.Second}
	gateway.ConfigureServer(s.gatewayHTTP)
	s.gatewayDone = make(chan error, 1)
	go func() { s.gatewayDone <- s.gatewayHTTP.Serve(glis) }()

	alis, err := net.Listen("tcp", config.ListenAddr(cfg.AdminAddr))
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	s.adminAddr = alis.Addr().String()
	s.adminHTTP = &http.Server{Handler: s.statusHandler(), ReadHeaderTimeout: 10 * time.Second}
	s.adminDone = make(chan error, 1)
	go func() { s.adminDone <- s.adminHTTP.Serve(alis) }()
	// Sampling starts once every address liveSnapshot reads is set.
	go s.Live.Run(xctx) // samples the hit rates until Close

	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// waitReady polls until every local router sees its workers and the global
// router sees every pool's local router.
func (s *System) waitReady(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		missing := s.notReady()
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %s: %w", missing, ctx.Err())
		case <-t.C:
		}
	}
}

func (s *System) notReady() string {
	for _, p := range s.Pools {
		ranks := 0
		for _, w := range p.Workers {
			ranks += w.DPSize
		}
		if got := len(p.Router.Router().Workers()); got < ranks {
			return fmt.Sprintf("pool %s: local router sees %d of %d worker ranks", p.Name, got, ranks)
		}
	}
	for _, rg := range s.Regions {
		for _, h := range rg.Router.Health() {
			if h.Health.Available == 0 {
				return fmt.Sprintf("region %s: pool %s: the region router sees no local router", rg.Name, h.Pool)
			}
		}
	}
	for _, h := range s.Global.Health() {
		if h.Health.Available == 0 {
			return fmt.Sprintf("pool %s: global router sees no local router", h.Pool)
		}
	}
	return ""
}

// CloseWithin is Close given d of its own: for a deferred close, whose
// caller's context may have ended already.
func (s *System) CloseWithin(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return s.Close(ctx)
}

// Close stops everything, front to back: the gateway (letting requests in
// flight finish until ctx ends), the ext_proc server, the global router,
// the workers, the local routers, NATS, etcd. It is safe on a partly
// started System and idempotent.
func (s *System) Close(ctx context.Context) error {
	if s.closeStarted {
		return nil
	}
	s.closeStarted = true
	var errs []error
	if s.gatewayHTTP != nil {
		if err := s.gatewayHTTP.Shutdown(ctx); err != nil {
			s.gatewayHTTP.Close()
		}
		if err := <-s.gatewayDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("gateway: %w", err))
		}
	}
	if s.adminHTTP != nil {
		if err := s.adminHTTP.Shutdown(ctx); err != nil {
			s.adminHTTP.Close()
		}
		if err := <-s.adminDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("admin: %w", err))
		}
	}
	if s.gw != nil {
		s.gw.Close()
	}
	if s.conn != nil {
		s.conn.Close()
	}
	if s.extprocStop != nil {
		s.extprocStop()
		if err := <-s.extprocDone; err != nil {
			errs = append(errs, err)
		}
	}
	if s.Global != nil {
		errs = append(errs, s.Global.Close())
	}
	errs = append(errs, s.closeRegions(ctx))
	for _, p := range s.Pools {
		for _, w := range p.Workers {
			errs = append(errs, w.close(ctx))
		}
	}
	for _, p := range s.Pools {
		if p.Router != nil {
			errs = append(errs, p.StopRouter(ctx))
		}
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.nats != nil {
		s.nats.Close()
	}
	if s.etcd != nil {
		errs = append(errs, s.etcd.close())
	}
	if s.tlsDir != "" {
		errs = append(errs, os.RemoveAll(s.tlsDir))
	}
	return errors.Join(errs...)
}

// Run starts the system, prints its Summary to out, waits for ctx to end
// (Ctrl-C), then stops everything within grace.
func Run(ctx context.Context, cfg Config, out io.Writer, grace time.Duration) error {
	s, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprint(out, s.Summary())
	<-ctx.Done()
	fmt.Fprintln(out, "\nstopping…")
	cctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := s.Close(cctx); err != nil {
		return err
	}
	fmt.Fprintln(out, "stopped")
	return nil
}

// loopbackAddr reports whether a listen address binds loopback only
// ("localhost", 127.0.0.0/8, ::1), as config.ListenAddr reads it: a port
// alone is loopback, as the gateway then binds.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(config.ListenAddr(addr))
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
