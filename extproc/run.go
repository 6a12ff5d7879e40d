package extproc

import (
	"context"
	"errors"
	"flag"
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
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/globalrouter"
)

// DefaultGCPercent is -gc-percent's default: at a paced 1,000 req/s the
// p99 is GC-bound at GOGC=100 (BENCHMARKS.md gives the figures).
const DefaultGCPercent = 400

// Options configure the `kvgate extproc` process: the server's Config plus
// the global router's configuration file and the process around them.
type Options struct {
	Config
	// PoolsFile is the global router's configuration (pools, policies,
	// models), read with globalrouter.LoadConfig.
	PoolsFile string
	// WatchInterval is how often PoolsFile is checked for changes (0: the
	// globalrouter default; negative: no hot reload).
	WatchInterval time.Duration
	// Etcd endpoints, for pools whose local routers are discovered in etcd.
	Etcd []string
	// MetricsAddr serves /metrics over HTTP ("" disables).
	MetricsAddr string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// GCPercent is the garbage collector's target (debug.SetGCPercent),
	// applied when the GOGC environment variable is not set; 0 leaves the
	// runtime's default. The decision path allocates per request while the
	// live heap stays small, so a higher target trades a little memory for
	// far fewer collections and a much shorter latency tail.
	GCPercent int
}

// ParseFlags builds Options from the defaults and args. -h returns
// flag.ErrHelp after printing the usage to usage.
func ParseFlags(name string, args []string, usage io.Writer) (Options, error) {
	o := Options{Config: Config{}.Defaults(), LogLevel: "info", MetricsAddr: "127.0.0.1:9003"}
	o.Addr = ":9002"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.StringVar(&o.Addr, "addr", o.Addr, "gRPC listen address of the ext_proc service")
	fs.StringVar(&o.PoolsFile, "config", "", "global router configuration file: pools, policies, models (required; see examples/pools.yaml)")
	fs.DurationVar(&o.WatchInterval, "config-watch", 0, "how often to check the configuration file for changes (0: default, <0: never)")
	etcd := fs.String("etcd", "", "comma-separated etcd endpoints, for pools that discover their local routers in etcd")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, `HTTP listen address of /metrics ("" disables)`)
	paths := fs.String("inference-paths", strings.Join(o.InferencePaths, ","), "comma-separated paths that are routed; others pass through")
	fs.IntVar(&o.MaxBodyBytes, "max-body-bytes", o.MaxBodyBytes, "largest request body accepted (413 past it)")
	reqMode := fs.String("request-body-mode", o.RequestBodyMode.String(), "request body mode assumed when Envoy does not say: FULL_DUPLEX_STREAMED or BUFFERED")
	respMode := fs.String("response-body-mode", o.ResponseBodyMode.String(), "response body mode assumed when Envoy does not say: STREAMED, FULL_DUPLEX_STREAMED or BUFFERED")
	fs.BoolVar(&o.HeaderFallbacks, "header-fallbacks", false, "no-op, accepted for old command lines: x-gateway-destination-endpoint always carries the ordered list (primary, then fallbacks), the same value as the envoy.lb metadata")
	fs.DurationVar(&o.RetryAfter, "retry-after", o.RetryAfter, "retry-after of a 429 or 503")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "debug, info, warn or error")
	fs.IntVar(&o.GCPercent, "gc-percent", DefaultGCPercent, "garbage collector target when GOGC is not set (0: the runtime's default)")
	if err := fs.Parse(args); err != nil {
		return Options{}, err
	}
	if fs.NArg() > 0 {
		return Options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *etcd != "" {
		o.Etcd = splitList(*etcd)
	}
	o.InferencePaths = splitList(*paths)
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
	if _, err := parseLevel(o.LogLevel); err != nil {
		return Options{}, fmt.Errorf("-log-level: %w", err)
	}
	return o, o.Config.Validate()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

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
// watches the file for changes, serves /metrics, and serves ext_proc until
// ctx ends.
func Run(ctx context.Context, o Options, logger *slog.Logger) error {
	if _, set := os.LookupEnv("GOGC"); !set && o.GCPercent > 0 {
		debug.SetGCPercent(o.GCPercent)
	}
	lis, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return fmt.Errorf("extproc: %w", err)
	}
	var mlis net.Listener
	if o.MetricsAddr != "" {
		if mlis, err = net.Listen("tcp", o.MetricsAddr); err != nil {
			lis.Close()
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return run(ctx, o, logger, lis, mlis)
}

// run is Run on listeners already open (mlis nil: no metrics); it closes
// them.
func run(ctx context.Context, o Options, logger *slog.Logger, lis, mlis net.Listener) error {
	closeAll := func() {
		lis.Close()
		if mlis != nil {
			mlis.Close()
		}
	}
	if logger == nil {
		lvl, err := parseLevel(o.LogLevel)
		if err != nil {
			closeAll()
			return err
		}
		logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	gcfg, err := globalrouter.LoadConfig(o.PoolsFile, nil)
	if err != nil {
		closeAll()
		return err
	}
	opts := []globalrouter.Option{globalrouter.WithLogger(logger), globalrouter.WithRegisterer(reg)}
	if len(o.Etcd) > 0 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: o.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			closeAll()
			return fmt.Errorf("etcd: %w", err)
		}
		defer cli.Close()
		opts = append(opts, globalrouter.WithEtcd(cli))
	}
	router, err := globalrouter.New(*gcfg, opts...)
	if err != nil {
		closeAll()
		return err
	}
	defer router.Close()
	srv, err := New(o.Config, router, logger, reg)
	if err != nil {
		closeAll()
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	running := 1
	go func() { errc <- srv.Serve(ctx, lis) }()
	if o.WatchInterval >= 0 {
		running++
		go func() {
			// The router logs each reload, taken or refused.
			errc <- router.WatchFile(ctx, o.PoolsFile, o.WatchInterval, nil)
		}()
	}
	if mlis != nil {
		hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		running++
		go func() {
			err := hs.Serve(mlis)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			errc <- err
		}()
		stopped := make(chan struct{})
		defer func() { <-stopped }()
		go func() {
			defer close(stopped)
			<-ctx.Done()
			sctx, scancel := context.WithTimeout(context.Background(), time.Second)
			defer scancel()
			_ = hs.Shutdown(sctx)
		}()
		logger.Info("metrics listening", "addr", mlis.Addr().String())
	}
	// The first part to stop (ctx, or a failure) stops the others.
	first := <-errc
	cancel()
	for range running - 1 {
		<-errc
	}
	return first
}
