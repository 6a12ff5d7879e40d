// Package localrouterd is the `kvgate localrouter` process: its flags and
// environment (config.go), the gRPC and admin listeners, TLS and the
// authorization of lifecycle calls by client certificate (authz.go), the
// short expiry of requests committed by unauthenticated unary calls
// (anonexpiry.go), etcd
// membership and registration, NATS KV events and replica sync, engine
// metrics scraping (localrouterd.go: Start, Run), around the service
// (localrouter/server) and the router (localrouter).
package localrouterd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/reflection"

	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/events"
	"github.com/kvgate/kvgate/localrouter/replica"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/localrouter/signals"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
)

// Deps are a Service's injected dependencies; zero values take defaults.
type Deps struct {
	Logger *slog.Logger
	// Registry receives the metrics and is served on /metrics (default: a
	// new registry with the Go and process collectors).
	Registry *prometheus.Registry
	// RouterOptions are passed to localrouter.New (Logger is filled in).
	RouterOptions localrouter.Options
}

// Service is a running local router: the gRPC server, etcd membership and
// registration, NATS events and replica sync, and the admin (metrics)
// endpoint, run by an internal/runner Group.
type Service struct {
	cfg        Config
	log        *slog.Logger
	router     *localrouter.Router
	srv        *server.Server
	anon       *anonExpiry // nil under identity (anonexpiry.go)
	group      *runner.Group
	grpcLis    net.Listener
	httpLis    net.Listener
	healthLis  net.Listener
	etcd       *clientv3.Client
	nc         *nats.Conn
	watcher    *registry.Watcher
	sub        *events.Subscriber
	sync       *replica.Sync
	scraper    *signals.Scraper
	reg        *registry.Registration
	closeOnce  sync.Once
	closeErr   error
	advertised string
}

// Start starts a local router and returns once it serves gRPC and is
// registered in etcd (it may still be not ready: see min_initial_workers).
// ctx bounds the start only; Close stops the service.
func Start(ctx context.Context, cfg Config, deps Deps) (_ *Service, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base := deps.Logger
	if base == nil {
		base = slog.Default()
	}
	// Each part adds its component and the pool; the replica id is common.
	log := base.With("router_id", cfg.RouterID)
	reg := deps.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	s := &Service{cfg: cfg, log: log.With("component", "localrouter.service", "pool", cfg.Pool)}
	s.group = runner.NewGroup(s.log)
	defer func() {
		if err != nil {
			_ = s.Close(context.WithoutCancel(ctx))
		}
	}()

	var creds credentials.TransportCredentials
	if cfg.TLS.Enabled() {
		tc, err := cfg.TLS.Config(s.log)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}

	ropts := deps.RouterOptions
	ropts.Logger = log.With("pool", cfg.Pool)
	if s.router, err = localrouter.New(cfg.Router, ropts); err != nil {
		return nil, err
	}
	for _, why := range cfg.Router.Unread(cfg.MetricsPeriod > 0) {
		log.Warn("setting takes no effect", "pool", cfg.Pool, "why", why)
	}
	if s.etcd, err = (runner.Etcd{Endpoints: cfg.Etcd, TLS: cfg.EtcdTLS}).Client(ctx); err != nil {
		return nil, err
	}
	if cfg.NATS != "" {
		natsCfg := runner.NATS{URL: cfg.NATS, TLS: cfg.NATSTLS, CredsFile: cfg.NATSCredsFile}
		if s.nc, err = natsCfg.Connect("kvgate-localrouter-"+cfg.RouterID, s.log); err != nil {
			return nil, err
		}
	}
	if cfg.Router.UseKVEvents {
		if s.sub, err = events.New(s.nc, s.router, events.Options{Pool: cfg.Pool, Logger: log}); err != nil {
			return nil, err
		}
	}
	var replicaStats func() replica.Stats
	var observer server.Observer
	if cfg.Router.ReplicaSync {
		if s.sync, err = replica.New(s.nc, s.router, replica.Options{Pool: cfg.Pool, RouterID: cfg.RouterID, Logger: log}); err != nil {
			return nil, err
		}
		replicaStats, observer = s.sync.Stats, s.sync
	}
	s.watcher = registry.NewWatcher(s.etcd, cfg.Pool, (*workerSet)(s), registry.WatcherOptions{BlockSize: cfg.Router.BlockSize, Logger: log})
	opts := server.Options{Router: s.router, Directory: s.watcher, Observer: observer, RouterID: cfg.RouterID, Pool: cfg.Pool, Logger: base}
	if s.sub != nil {
		opts.EventStats = s.sub.Stats
	}
	if cfg.MetricsPeriod > 0 {
		if s.scraper, err = signals.NewScraper(signals.ScraperOptions{
			Period: cfg.MetricsPeriod, Targets: s.scrapeTargets, Sink: s.router,
			Registerer: reg, Logger: log.With("pool", cfg.Pool),
		}); err != nil {
			return nil, err
		}
		opts.ScrapeStats, opts.MetricsPeriod = s.scraper.Stats, cfg.MetricsPeriod
	}
	if s.srv, err = server.New(opts); err != nil {
		return nil, err
	}
	m, err := server.NewMetrics(reg, s.srv, replicaStats)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}

	// Membership first, so the router is as ready as it can be when it
	// starts answering.
	s.group.Go(ctx, "etcd watch", s.watcher.Run)
	select {
	case <-s.watcher.Synced():
	case <-ctx.Done():
		return nil, fmt.Errorf("listing workers in etcd %v: %w", cfg.Etcd, ctx.Err())
	}
	if s.scraper != nil {
		s.group.Go(ctx, "engine metrics scraper", func(ctx context.Context) error {
			_ = s.scraper.Run(ctx) // ends with the group; failures are counted, never fatal
			return nil
		})
	}

	if s.grpcLis, err = runner.Listen("addr", cfg.GRPCAddr); err != nil {
		return nil, err
	}
	gopts := server.GRPCServerOptions(m)
	// Under mutual TLS every caller is identified by a certificate the
	// client CA verified; otherwise anonymous commits expire early.
	identified := creds != nil && cfg.TLS.MutualTLS()
	if creds != nil {
		gopts = append(gopts, grpc.Creds(creds))
		if cfg.TLS.MutualTLS() && len(cfg.AuthorizedClients) > 0 {
			a := authorizer{allowed: cfg.AuthorizedClients}
			gopts = append(gopts, grpc.ChainUnaryInterceptor(a.unary()), grpc.ChainStreamInterceptor(a.stream()))
		}
	}
	if !identified && cfg.AnonymousCommitExpiry > 0 {
		if s.anon, err = newAnonExpiry(cfg.AnonymousCommitExpiry, s.router, s.srv, reg); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		gopts = append(gopts, grpc.ChainUnaryInterceptor(s.anon.unary()))
	}
	gs := grpc.NewServer(gopts...)
	s.srv.Register(gs)
	reflection.Register(gs)
	s.group.ServeGRPC("grpc", gs, s.grpcLis)
	if cfg.HealthAddr != "" {
		if s.healthLis, err = runner.Listen("health-addr", cfg.HealthAddr); err != nil {
			return nil, err
		}
		hs := grpc.NewServer()
		s.srv.RegisterHealth(hs)
		s.group.ServeGRPC("health", hs, s.healthLis)
	}
	if s.httpLis, err = s.group.ServeAdmin("admin-addr", cfg.MetricsAddr, runner.AdminHandler(reg, nil)); err != nil {
		return nil, err
	}

	s.advertised = cfg.AdvertiseAddr
	if s.advertised == "" {
		s.advertised = advertise(s.grpcLis.Addr())
	}
	info := membership.RouterInfo{ID: cfg.RouterID, GRPCAddress: s.advertised, Pool: cfg.Pool, BlockSize: cfg.Router.BlockSize}
	if s.reg, err = registry.RegisterRouter(ctx, s.etcd, info, cfg.RegisterTTL, log.With("component", "localrouter.registration", "pool", cfg.Pool)); err != nil {
		return nil, err
	}
	s.log.Info("local router serving", "grpc", s.grpcLis.Addr().String(), "advertised", s.advertised,
		"admin", s.MetricsAddr(), "tls", cfg.TLS.Enabled(), "mtls", cfg.TLS.MutualTLS(), "ready", s.router.Ready(), "workers", len(s.watcher.Workers()),
		"use_kv_events", cfg.Router.UseKVEvents, "replica_sync", cfg.Router.ReplicaSync, "block_size", cfg.Router.BlockSize)
	return s, nil
}

// scrapeTargets lists the workers' engine metrics endpoints: each one's
// registered metrics_url, or http://<address>/metrics.
func (s *Service) scrapeTargets() []signals.Target {
	ws := s.watcher.Workers()
	out := make([]signals.Target, 0, len(ws))
	for _, w := range ws {
		out = append(out, signals.Target{ID: w.ID, URL: w.MetricsEndpoint()})
	}
	return out
}

// advertise turns a listener address into one other hosts can dial.
func advertise(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// workerSet applies the Watcher's changes to the router, the event
// subscriber and the health status.
type workerSet Service

var (
	_ registry.Handler = (*workerSet)(nil)
	_ server.Directory = (*registry.Watcher)(nil)
	_ server.Observer  = (*replica.Sync)(nil)
	_ events.Target    = (*localrouter.Router)(nil)
)

func (m *workerSet) WorkerUp(info membership.WorkerInfo) {
	m.router.AddWorker(info.ID, info.DPSize)
	wasStale := m.router.WorkerStale(info.ID)
	m.router.SetWorkerStale(info.ID, info.Stale)
	if wasStale != info.Stale {
		m.log.Warn("worker staleness changed (it cannot publish KV events while stale)", "worker", info.ID, "stale", info.Stale)
	}
	if m.sub != nil {
		m.sub.WorkerUp(info.ID)
		if wasStale && !info.Stale {
			// What it published while stale may be lost.
			m.sub.Resync(info.ID)
		}
	}
	m.srv.UpdateHealth()
}

func (m *workerSet) WorkerDown(id string) {
	freed := m.router.RemoveWorker(id)
	if m.sub != nil {
		m.sub.WorkerDown(id)
	}
	if len(freed) > 0 {
		m.log.Info("freed the requests of a worker that left", "worker", id, "requests", len(freed))
	}
	m.srv.UpdateHealth()
}

// Router returns the service's router.
func (s *Service) Router() *localrouter.Router { return s.router }

// GRPCAddr is the address the gRPC server listens on.
func (s *Service) GRPCAddr() string { return s.grpcLis.Addr().String() }

// AdvertisedAddr is the gRPC address registered in etcd.
func (s *Service) AdvertisedAddr() string { return s.advertised }

// MetricsAddr is the address of /metrics, "" when disabled.
func (s *Service) MetricsAddr() string {
	if s.httpLis == nil {
		return ""
	}
	return s.httpLis.Addr().String()
}

// HealthAddr is the address of the plaintext health server, "" when off.
func (s *Service) HealthAddr() string {
	if s.healthLis == nil {
		return ""
	}
	return s.healthLis.Addr().String()
}

// Err reports a component that failed while running (the gRPC or metrics
// server, or the etcd watch).
func (s *Service) Err() <-chan error { return s.group.Err() }

// Close deregisters the router, drains gRPC (until ctx ends, then stops
// hard), and stops everything Start started. It is safe to call twice.
func (s *Service) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.reg != nil {
			errs = append(errs, s.reg.Close())
		}
		if s.srv != nil {
			s.srv.Shutdown()
		}
		if s.anon != nil {
			s.anon.close()
		}
		errs = append(errs, s.group.Stop(ctx))
		if s.sub != nil {
			errs = append(errs, s.sub.Close())
		}
		if s.sync != nil {
			errs = append(errs, s.sync.Close())
		}
		if s.nc != nil {
			s.nc.Close()
		}
		if s.etcd != nil {
			errs = append(errs, s.etcd.Close())
		}
		if s.router != nil {
			errs = append(errs, s.router.Close())
		}
		s.closeErr = errors.Join(errs...)
		s.log.Info("local router stopped", "err", s.closeErr)
	})
	return s.closeErr
}

// Run starts the service, serves until ctx ends or a component fails, then
// closes it (allowing 10 s to drain).
func Run(ctx context.Context, cfg Config, deps Deps) error {
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := Start(startCtx, cfg, deps)
	cancel()
	if err != nil {
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-s.Err():
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runner.DefaultDrain)
	defer cancel()
	return errors.Join(runErr, s.Close(closeCtx))
}
