// Package runner is the process plumbing kvgate's long-running subcommands
// share: a Group that serves gRPC and admin HTTP listeners and runs
// background tasks, stops them all when the first one fails or the context
// ends, and drains gracefully; the admin handler (metrics); and the etcd
// and NATS clients with their TLS and credential settings. The local
// router's service, `kvgate extproc`, `kvgate relay` and the mocker run on
// a Group (the mocker's Instance.Kill, the crash that internal/up and the
// fault tests inject, closes its HTTP server under the group, which counts
// http.ErrServerClosed as no failure, so the rest of the process carries on).
//
// Files: runner.go (Group: Go, ServeGRPC, ServeHTTP, OnStop, Stop, Run;
// Listen, AdminHandler, ServeAdmin), clients.go (Etcd and NATS: their
// flags, TLS and credentials, Client, EtcdConfig, Connect).
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/lib/config"
)

// DefaultDrain is how long Run lets servers drain before stopping them hard.
const DefaultDrain = 10 * time.Second

// Group runs the parts of one process. Parts start when added; the first
// to fail is reported on Err; Stop stops them all, gRPC servers gracefully
// (open streams finish, until Stop's ctx ends), HTTP servers with Shutdown
// (then Close, once Stop's ctx ends), tasks by cancelling their context.
// Safe for concurrent use.
type Group struct {
	log  *slog.Logger
	wg   sync.WaitGroup
	errs chan error

	mu       sync.Mutex
	grpcs    []*grpc.Server
	https    []*http.Server
	cancels  []context.CancelFunc // of the tasks Go started
	stopping bool                 // Stop has cancelled the tasks
	onStop   []func(context.Context) error
	stopOnce sync.Once
	stopErr  error
}

// NewGroup returns an empty group logging to log (nil: slog.Default()).
func NewGroup(log *slog.Logger) *Group {
	if log == nil {
		log = slog.Default()
	}
	return &Group{log: log, errs: make(chan error, 16)}
}

func (g *Group) fail(name string, err error) {
	select {
	case g.errs <- fmt.Errorf("%s: %w", name, err):
	default:
	}
}

// Go runs fn in its own goroutine until it returns or Stop cancels its ctx.
// fn's ctx carries ctx's values but not its cancellation: only Stop ends it
// (Run stops the group when its own ctx ends, after the servers drained).
// A non-nil error returned before Stop is reported on Err.
func (g *Group) Go(ctx context.Context, name string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.mu.Lock()
	if g.stopping {
		cancel()
	} else {
		g.cancels = append(g.cancels, cancel)
	}
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			g.fail(name, err)
		}
	}()
}

// ServeGRPC serves srv on lis until Stop.
func (g *Group) ServeGRPC(name string, srv *grpc.Server, lis net.Listener) {
	g.mu.Lock()
	g.grpcs = append(g.grpcs, srv)
	g.mu.Unlock()
	g.serve(name, func() error { return srv.Serve(lis) }, grpc.ErrServerStopped)
}

// ServeHTTP serves srv on lis until Stop.
func (g *Group) ServeHTTP(name string, srv *http.Server, lis net.Listener) {
	g.mu.Lock()
	g.https = append(g.https, srv)
	g.mu.Unlock()
	g.serve(name, func() error { return srv.Serve(lis) }, http.ErrServerClosed)
}

// serve runs serve in the group; its error is a failure unless it is
// stopped, the server's "stopped on purpose" error.
func (g *Group) serve(name string, serve func() error, stopped error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := serve(); err != nil && !errors.Is(err, stopped) {
			g.fail(name, err)
		}
	}()
}

// OnStop registers fn to run after every part stopped, in reverse order of
// registration (close clients after the servers that use them).
func (g *Group) OnStop(fn func(ctx context.Context) error) {
	g.mu.Lock()
	g.onStop = append(g.onStop, fn)
	g.mu.Unlock()
}

// Err reports the first part that failed.
func (g *Group) Err() <-chan error { return g.errs }

// Stop stops every part and runs the OnStop functions; it returns their
// errors joined. gRPC servers drain until ctx ends, then stop hard. Stop is
// idempotent.
func (g *Group) Stop(ctx context.Context) error {
	g.stopOnce.Do(func() {
		g.mu.Lock()
		grpcs, https, onStop := g.grpcs, g.https, g.onStop
		g.mu.Unlock()
		var errs []error
		var stopping sync.WaitGroup
		for _, s := range grpcs {
			stopping.Add(1)
			go func() {
				defer stopping.Done()
				done := make(chan struct{})
				go func() { s.GracefulStop(); close(done) }()
				select {
				case <-done:
				case <-ctx.Done():
					s.Stop()
					<-done
				}
			}()
		}
		stopping.Wait()
		for _, s := range https {
			if err := s.Shutdown(ctx); err != nil {
				_ = s.Close() // drain over: close what is left, as gRPC's Stop does
				errs = append(errs, err)
			}
		}
		g.mu.Lock()
		g.stopping = true
		cancels := g.cancels
		g.cancels = nil
		g.mu.Unlock()
		for _, cancel := range cancels {
			cancel()
		}
		g.wg.Wait()
		for i := len(onStop) - 1; i >= 0; i-- {
			if err := onStop[i](ctx); err != nil {
				errs = append(errs, err)
			}
		}
		g.stopErr = errors.Join(errs...)
	})
	return g.stopErr
}

// Run waits until ctx ends or a part fails, then stops the group, allowing
// drain (0: DefaultDrain) for servers to finish. It returns the failure, if
// any, joined with Stop's errors.
func (g *Group) Run(ctx context.Context, drain time.Duration) error {
	if drain <= 0 {
		drain = DefaultDrain
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-g.errs:
		g.log.Error("stopping: a part failed", "err", runErr)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	return errors.Join(runErr, g.Stop(sctx))
}

// Listen opens a TCP listener on addr as config.ListenAddr reads it (a
// port alone is loopback); the error names the flag.
func Listen(flagName, addr string) (net.Listener, error) {
	addr = config.ListenAddr(addr)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-%s %s: %w", flagName, addr, err)
	}
	return lis, nil
}

// AdminHandler is the admin HTTP surface: /metrics from reg, plus extra
// handlers by pattern (status pages, config dumps). It belongs on the
// admin listener, never on a public one.
func AdminHandler(reg *prometheus.Registry, extra map[string]http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	for p, h := range extra {
		mux.Handle(p, h)
	}
	return mux
}

// ServeAdmin listens on addr (flagName names it in errors; "" addr: no
// admin listener, nil returned) and serves h in g.
func (g *Group) ServeAdmin(flagName, addr string, h http.Handler) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := Listen(flagName, addr)
	if err != nil {
		return nil, err
	}
	g.ServeHTTP("admin", &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, lis)
	g.log.Info("admin listening", "addr", lis.Addr().String())
	return lis, nil
}
