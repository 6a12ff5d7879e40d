// Package extprocd is the `kvgate extproc` process: its flags, the
// configuration file and its watch, etcd and the local routers' TLS,
// tracing, the admin listener with /metrics and the live status page, the
// gRPC health listener and the subtree service, around the ext_proc
// server (extproc) and the global router (globalrouter).
//
// Files: extprocd.go (flags, run), bounds.go (the ext_proc stream bounds'
// flags, shared with kvgate up).
package extprocd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/status"
	"github.com/kvgate/kvgate/internal/subtreed"
	"github.com/kvgate/kvgate/internal/tlsconfig"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// DefaultGCPercent is -gc-percent's default: at a paced 1,000 req/s the
// p99 is GC-bound at GOGC=100 (BENCHMARKS.md gives the figures).
const DefaultGCPercent = 400

// DuplicateKeysUsage is the usage of -duplicate-keys, on kvgate extproc
// and kvgate up.
const DuplicateKeysUsage = `a request body naming a key twice in one object: refuse (400 duplicate_key, naming the key and its path) or last (read as the engine, Python's json, reads it: the last occurrence, at every depth); docs/security.md`

// Options configure the `kvgate extproc` process: the server's Config plus
// the global router's configuration file and the process around them.
type Options struct {
	extproc.Config
	// PoolsFile is the global router's configuration (pools, policies,
	// models), read with globalrouter.LoadConfig.
	PoolsFile string
	// WatchInterval is how often PoolsFile is checked for changes (0: the
	// globalrouter default; negative: no hot reload).
	WatchInterval time.Duration
	// ShadowFile is a candidate chain run alongside the live one
	// (globalrouter.WithShadowFile; "" none beyond the configuration's own
	// shadow block).
	ShadowFile string
	// Etcd endpoints, for pools whose local routers are discovered in etcd.
	Etcd []string
	// EtcdTLS is the etcd client's TLS.
	EtcdTLS tlsconfig.Client
	// MetricsAddr is the admin HTTP address (-admin-addr, alias
	// -metrics-addr): /metrics and the live status page (/kvgate/status/)
	// ("" disables both). Loopback by default.
	MetricsAddr string
	// TLS of the ext_proc gRPC server (off unless set).
	TLS tlsconfig.Server
	// HealthAddr serves the gRPC health service alone, in plaintext, for
	// kubelet gRPC probes that cannot do TLS ("" disables).
	HealthAddr string
	// RouterTLS is the TLS of the clients of local routers.
	RouterTLS tlsconfig.Client
	// OTLPEndpoint is the OTLP/gRPC collector decisions are traced to
	// ("" : tracing off); OTLPInsecure sends without TLS.
	OTLPEndpoint string
	OTLPInsecure bool
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// LogFormat is json (the default) or text.
	LogFormat string
	// GCPercent is the garbage collector's target (debug.SetGCPercent),
	// applied when the GOGC environment variable is not set; 0 leaves the
	// runtime's default. The decision path allocates per request while the
	// live heap stays small, so a higher target trades a little memory for
	// far fewer collections and a much shorter latency tail.
	GCPercent int
	// Policies are the pool policies the configuration may name (nil: the
	// built-ins); Scorers the worker-chain filters and scorers its pools'
	// worker_chain may name (nil: the built-ins). Not flags: a program
	// adds its own with app.WithPolicy and app.WithScorer.
	Policies *policies.Registry
	Scorers  *localrouter.ScorerRegistry
	// Subtree serves the router's subtree to a parent global router
	// (-subtree-*, off by default; docs/hierarchy.md).
	Subtree subtreed.Config
}

// ParseFlags builds Options from the defaults, the environment (each flag
// -foo-bar also read from KVGATE_FOO_BAR) and args. -h returns
// flag.ErrHelp after printing the usage to usage.
func ParseFlags(name string, args []string, usage io.Writer) (Options, error) {
	return parseFlags(name, args, os.Getenv, usage)
}

func parseFlags(name string, args []string, getenv func(string) string, usage io.Writer) (Options, error) {
	o := Options{Config: extproc.Config{}.Defaults(), LogLevel: "info", MetricsAddr: config.DefaultExtprocAdminAddr}
	fs := config.NewFlagSet(name, usage)
	fs.Var(config.Listen(&o.Addr), "addr", "gRPC listen address of the ext_proc service (a port alone is loopback)")
	fs.StringVar(&o.PoolsFile, "config", "", "global router configuration file: pools, policies, models (required; see examples/pools.yaml)")
	fs.DurationVar(&o.WatchInterval, "config-watch", 0, fmt.Sprintf("how often to check the configuration file (and -shadow-config) for changes (0: %v; negative: never)", globalrouter.DefaultWatchInterval))
	fs.StringVar(&o.ShadowFile, "shadow-config", "", "a shadow file: a candidate policy chain that ranks alongside the live one on every request, never committing (metrics kvgate_shadow_*; watched like -config)")
	fs.StringVar(&o.OTLPEndpoint, "otlp-endpoint", "", `OTLP/gRPC collector host:port to trace decisions to (spans decide, tokenize, probe, commit, continuing Envoy's traceparent; "" : off)`)
	fs.BoolVar(&o.OTLPInsecure, "otlp-insecure", true, "send traces without TLS")
	etcd := fs.String("etcd", "", "comma-separated etcd endpoints, for pools that discover their local routers in etcd")
	o.EtcdTLS.Flags(fs, "etcd", "etcd", false)
	fs.Var(config.Listen(&o.MetricsAddr), "admin-addr", `admin HTTP listen address: /metrics ("" disables)`)
	fs.Alias("metrics-addr", "admin-addr")
	o.TLS.Flags(fs)
	fs.Var(config.Listen(&o.HealthAddr), "health-addr", "plaintext gRPC health server address, for probes that cannot do TLS (empty: none)")
	o.RouterTLS.Flags(fs, "router-tls", "the local routers", true)
	o.Subtree.Flags(fs)
	paths := fs.String("inference-paths", strings.Join(o.InferencePaths, ","), "comma-separated paths that are routed; others pass through")
	fs.IntVar(&o.MaxBodyBytes, "max-body-bytes", o.MaxBodyBytes, "largest request body accepted (413 past it; 0: the default)")
	fs.Var(&o.DuplicateKeys, "duplicate-keys", DuplicateKeysUsage)
	BoundsFlags(fs, &o.Config)
	reqMode := fs.String("request-body-mode", o.RequestBodyMode.String(), "request body mode assumed when Envoy does not say: FULL_DUPLEX_STREAMED or BUFFERED")
	respMode := fs.String("response-body-mode", o.ResponseBodyMode.String(), "response body mode assumed when Envoy does not say: STREAMED, FULL_DUPLEX_STREAMED or BUFFERED")
	fs.DurationVar(&o.RetryAfter, "retry-after", o.RetryAfter, "retry-after of a 429 (saturated) or a 503 (no pool reachable), unless the refusal names its own (flow control's); 0: the default")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", config.LogJSON, "json (one object a line, as every kvgate subcommand logs by default) or text")
	fs.IntVar(&o.GCPercent, "gc-percent", DefaultGCPercent, "garbage collector target when GOGC is not set (0: the runtime's default)")
	if err := fs.Parse(args, getenv); err != nil {
		return Options{}, err
	}
	if *etcd != "" {
		o.Etcd = config.SplitList(*etcd)
	}
	o.InferencePaths = config.SplitList(*paths)
	var err error
	if o.RequestBodyMode, err = parseMode(*reqMode); err != nil {
		return Options{}, fmt.Errorf("-request-body-mode: %w", err)
	}
	if o.ResponseBodyMode, err = parseMode(*respMode); err != nil {
		return Options{}, fmt.Errorf("-response-body-mode: %w", err)
	}
	if o.PoolsFile == "" {
		return Options{}, errors.New("-config: required (the pools and policies; see examples/pools.yaml)")
	}
	if err := (config.Logging{Level: o.LogLevel, Format: o.LogFormat}).Validate(); err != nil {
		return Options{}, err
	}
	if err := o.TLS.Validate(); err != nil {
		return Options{}, err
	}
	if err := o.Subtree.Validate(); err != nil {
		return Options{}, err
	}
	if err := o.Subtree.CheckGiven(fs, o.TLS.MutualTLS()); err != nil {
		return Options{}, err
	}
	if err := fs.NotRead("traces are sent only with -otlp-endpoint", "otlp-insecure"); err != nil && o.OTLPEndpoint == "" {
		return Options{}, err
	}
	if len(o.Etcd) == 0 {
		fs.WarnNotRead("read by the etcd client only, and there is no -etcd", "etcd-ca-file", "etcd-cert-file", "etcd-key-file")
	}
	if _, gogc := lookupEnv("GOGC"); gogc {
		fs.WarnNotRead("the GOGC environment variable is set, and wins", "gc-percent")
	}
	if o.Subtree.Pool != "" && len(o.Etcd) == 0 {
		return Options{}, errors.New("-subtree-pool: needs -etcd (the subtree registers there)")
	}
	return o, o.Config.Validate()
}

// lookupEnv is os.LookupEnv (a variable of tests).
var lookupEnv = os.LookupEnv

func parseMode(s string) (extprocfilterv3.ProcessingMode_BodySendMode, error) {
	v, ok := extprocfilterv3.ProcessingMode_BodySendMode_value[strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("unknown body mode %q", s)
	}
	return extprocfilterv3.ProcessingMode_BodySendMode(v), nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// Run is the `kvgate extproc` process: it loads the global router's
// configuration, builds the router (connecting to etcd when given),
// watches the file for changes, serves the admin listener (/metrics), and
// serves ext_proc (TLS when configured) until ctx ends.
func Run(ctx context.Context, o Options, logger *slog.Logger) error {
	if _, set := os.LookupEnv("GOGC"); !set && o.GCPercent > 0 {
		debug.SetGCPercent(o.GCPercent)
	}
	lis, err := runner.Listen("addr", o.Addr)
	if err != nil {
		return fmt.Errorf("extproc: %w", err)
	}
	var mlis net.Listener
	if o.MetricsAddr != "" {
		if mlis, err = runner.Listen("admin-addr", o.MetricsAddr); err != nil {
			lis.Close()
			return err
		}
	}
	return run(ctx, o, logger, lis, mlis)
}

// run is Run on listeners already open (mlis nil: no admin listener); it
// closes them.
func run(ctx context.Context, o Options, logger *slog.Logger, lis, mlis net.Listener) (err error) {
	defer func() {
		lis.Close()
		if mlis != nil {
			mlis.Close()
		}
	}()
	if logger == nil {
		lvl, err := parseLevel(o.LogLevel)
		if err != nil {
			return err
		}
		logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	}
	g := runner.NewGroup(logger)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var sopts []grpc.ServerOption
	if o.TLS.Enabled() {
		tc, err := o.TLS.Config(logger)
		if err != nil {
			return err
		}
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(tc)))
	}
	gcfg, err := globalrouter.LoadConfig(o.PoolsFile, o.Policies)
	if err != nil {
		return err
	}
	if err := gcfg.CheckWorkerChains(localrouter.PoolChainCheck(o.Scorers)); err != nil {
		return err
	}
	for _, why := range gcfg.Unread() {
		logger.Warn("setting takes no effect", "why", why)
	}
	for _, p := range gcfg.Pools {
		if p.Routers.Etcd && len(o.Etcd) == 0 {
			return fmt.Errorf("%s: pool %q discovers its local routers in etcd (routers.etcd): give -etcd ENDPOINTS", o.PoolsFile, p.Name)
		}
	}
	decisions := status.NewRecorder(20) // the status page's last decisions
	opts := []globalrouter.Option{globalrouter.WithLogger(logger), globalrouter.WithRegisterer(reg), globalrouter.WithShadowFile(o.ShadowFile)}
	if o.Policies != nil {
		opts = append(opts, globalrouter.WithPolicies(o.Policies))
	}
	if mlis != nil {
		opts = append(opts, globalrouter.WithObserver(decisions.Observe))
	}
	tp, err := tracing.Setup(ctx, tracing.Options{Endpoint: o.OTLPEndpoint, Insecure: o.OTLPInsecure, Service: "kvgate-extproc"})
	if err != nil {
		return err
	}
	if tp != nil {
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = tp.Shutdown(sctx) // spans still batched are flushed or dropped
		}()
		opts = append(opts, globalrouter.WithTracerProvider(tp))
	}
	if o.RouterTLS.Enabled() {
		tc, err := o.RouterTLS.Config(logger)
		if err != nil {
			return fmt.Errorf("-router-tls-*: %w", err)
		}
		opts = append(opts, globalrouter.WithDialer(pool.ChannelDialer(grpc.WithTransportCredentials(credentials.NewTLS(tc)))))
	}
	var etcdCli *clientv3.Client
	if len(o.Etcd) > 0 {
		cli, err := (runner.Etcd{Endpoints: o.Etcd, TLS: o.EtcdTLS}).Client(ctx)
		if err != nil {
			return err
		}
		defer cli.Close()
		etcdCli = cli
		opts = append(opts, globalrouter.WithEtcd(cli))
	}
	var slis net.Listener
	if o.Subtree.Enabled() {
		if slis, err = o.Subtree.ListenOn(); err != nil {
			return err
		}
		defer slis.Close()
		opts = append(opts, o.Subtree.RouterOption(slis.Addr().String()))
	}
	router, err := globalrouter.New(*gcfg, opts...)
	if err != nil {
		return err
	}
	defer router.Close()
	if slis != nil {
		if _, err := subtreed.Start(ctx, o.Subtree, slis, router, &o.TLS, etcdCli, reg, g, logger); err != nil {
			_ = g.Stop(context.WithoutCancel(ctx))
			return err
		}
	}
	srv, err := extproc.New(o.Config, router, logger, reg)
	if err != nil {
		return err
	}

	g.Go(ctx, "extproc", func(ctx context.Context) error { return srv.Serve(ctx, lis, sopts...) })
	if o.HealthAddr != "" {
		hlis, err := runner.Listen("health-addr", o.HealthAddr)
		if err != nil {
			_ = g.Stop(context.WithoutCancel(ctx))
			return err
		}
		hs := grpc.NewServer()
		srv.RegisterHealth(hs)
		g.ServeGRPC("health", hs, hlis)
	}
	if o.WatchInterval >= 0 {
		g.Go(ctx, "config watch", func(ctx context.Context) error {
			// The router logs each reload, taken or refused.
			return router.WatchFile(ctx, o.PoolsFile, o.WatchInterval, nil)
		})
	}
	if mlis != nil {
		page := status.New(status.Options{Recorder: decisions, Source: func(context.Context) status.Snapshot {
			return status.Snapshot{Title: "kvgate extproc — live status", Info: []status.Fact{{Label: "ext_proc", Value: lis.Addr().String()}},
				Pools: status.RouterPools(router, reg), Config: status.RouterConfig(router), Flow: status.RouterFlow(router)}
		}})
		g.Go(ctx, "status page", func(ctx context.Context) error { page.Run(ctx); return nil })
		g.ServeHTTP("admin", &http.Server{Handler: runner.AdminHandler(reg, map[string]http.Handler{"/kvgate/status/": page.Handler("/kvgate/status")}), ReadHeaderTimeout: 5 * time.Second}, mlis)
		logger.Info("admin listening", "addr", mlis.Addr().String())
	}
	// The first part to stop (ctx, or a failure) stops the others; the
	// ext_proc server drains within its own ShutdownTimeout.
	return g.Run(ctx, o.ShutdownTimeout+time.Second)
}
