// Package mockerd is the `kvgate mocker` process: a simulated inference
// engine (mocker.Server) with its listener, its KV-event sink (ZMQ or
// NATS, one per data-parallel rank), TLS and etcd self-registration
// (Start, Run).
package mockerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/tlsconfig"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
	"github.com/kvgate/kvgate/mocker"
)

// KV event modes of a running mocker.
const (
	EventsZMQ  = "zmq"  // vLLM's ZMQ PUB format (a relay carries them to NATS)
	EventsNATS = "nats" // straight to NATS through kvevents.Publisher
	EventsNone = "none"
)

// RunConfig is a whole mocker process: HTTP API, KV events, registration.
type RunConfig struct {
	Server mocker.ServerConfig
	// Listen is the HTTP listen address (127.0.0.1:8001; port 0 picks one).
	Listen string
	// Advertise is the host:port registered in etcd; defaults to the
	// listener's address (127.0.0.1 for an unspecified host).
	Advertise string
	// Pool and WorkerID name the worker in events and in etcd ("default",
	// "mocker-<port>").
	Pool, WorkerID string
	// Events is EventsZMQ (default), EventsNATS or EventsNone.
	Events string
	// ZMQEndpoint is where the PUB socket binds (tcp://127.0.0.1:5557;
	// tcp://*:5557 for every interface) and
	// ZMQTopic the topic of its messages ("kv-events").
	ZMQEndpoint, ZMQTopic string
	// ZMQReplayEndpoint, when set, serves vLLM's replay socket there
	// (keeping the last 10,000 batches).
	ZMQReplayEndpoint string
	// NATSURL is dialled for EventsNATS unless RunDeps.NATS is set.
	NATSURL string
	// NATSTLS and NATSCredsFile secure that NATS client.
	NATSTLS       tlsconfig.Client
	NATSCredsFile string
	// EtcdEndpoints enable self-registration (unless RunDeps.Etcd is set).
	EtcdEndpoints []string
	// EtcdTLS is the etcd client's TLS.
	EtcdTLS  tlsconfig.Client
	LeaseTTL time.Duration
	// StaleAfter is how long publishing KV events over NATS may fail
	// before the registration is marked stale (default 5 s).
	StaleAfter time.Duration
}

// RunDeps are optional ready-made dependencies (tests, `kvgate up`).
type RunDeps struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	NATS     *nats.Conn
	Etcd     *clientv3.Client
	// Observer (nil: none) is the server's mocker.ServerOptions.Observer:
	// `kvgate bench -chaos -accounting` reads each request's admission and
	// departure through it.
	Observer mocker.RequestObserver
}

// Instance is a started mocker.
type Instance struct {
	Server *mocker.Server
	// Addr is the HTTP address actually bound.
	Addr string
	// WorkerID is the worker's id in events and in etcd.
	WorkerID string
	// ZMQEndpoint is the PUB endpoint a relay should dial (EventsZMQ), and
	// ZMQReplayEndpoint its replay socket ("" if not served): rank 0's.
	// ZMQEndpoints and ZMQReplayEndpoints list every rank's, in rank order
	// (`kvgate relay --zmq` takes them comma-separated).
	ZMQEndpoint, ZMQReplayEndpoint   string
	ZMQEndpoints, ZMQReplayEndpoints []string

	done chan struct{}
	err  error
	kill func()
}

// Kill closes the HTTP listener and every connection at once, as a crashed
// process's are: requests in flight break mid-response and new ones are
// refused. The engine, the KV events and the etcd registration carry on
// until the instance's context ends (a crashed worker stays registered
// until its lease expires). Idempotent.
func (i *Instance) Kill() {
	if i.kill != nil {
		i.kill()
	}
}

// Wait blocks until the instance has shut down (after its context ended)
// and returns the first error that stopped it.
func (i *Instance) Wait() error {
	<-i.done
	return i.err
}

// offsetEndpoint is endpoint with its TCP port raised by rank (vLLM's
// offset_endpoint_port for data-parallel ranks); port 0 stays 0.
func offsetEndpoint(endpoint string, rank int) (string, error) {
	if rank == 0 {
		return endpoint, nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	if !strings.HasPrefix(endpoint, "tcp://") || i < len("tcp://") {
		return "", fmt.Errorf("%q: data-parallel ranks need a tcp://host:port endpoint", endpoint)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port < 0 || port+rank > 65535 {
		return "", fmt.Errorf("%q: bad port for rank %d", endpoint, rank)
	}
	if port == 0 {
		return endpoint, nil
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// Run starts a mocker and serves until ctx ends.
func Run(ctx context.Context, cfg RunConfig, deps RunDeps) error {
	inst, err := Start(ctx, cfg, deps)
	if err != nil {
		return err
	}
	return inst.Wait()
}

// Start brings a mocker up and returns once it serves; it shuts down when
// ctx ends (see Instance.Wait).
func Start(ctx context.Context, cfg RunConfig, deps RunDeps) (inst *Instance, err error) {
	log := deps.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8001"
	}
	if cfg.Pool == "" {
		cfg.Pool = "default"
	}
	if cfg.Events == "" {
		cfg.Events = EventsZMQ
	}
	if cfg.ZMQEndpoint == "" {
		cfg.ZMQEndpoint = config.DefaultMockerZMQEndpoint
	}
	if cfg.ZMQTopic == "" {
		cfg.ZMQTopic = "kv-events"
	}
	if err := cfg.Server.Engine.Validate(); err != nil {
		return nil, err
	}
	engCfg := cfg.Server.Engine.Defaults()

	// The instance runs on a runner.Group like kvgate's other processes:
	// what Start opens is closed by the group's OnStop, in reverse order,
	// whether Start fails half-way or the instance shuts down.
	g := runner.NewGroup(log)
	closeOnStop := func(f func()) { g.OnStop(func(context.Context) error { f(); return nil }) }
	defer func() {
		if err != nil {
			_ = g.Stop(context.Background())
		}
	}()

	ln, err := net.Listen("tcp", config.ListenAddr(cfg.Listen))
	if err != nil {
		return nil, fmt.Errorf("mocker: %w", err)
	}
	closeOnStop(func() { ln.Close() })
	tcp := ln.Addr().(*net.TCPAddr)
	if cfg.Advertise == "" {
		host := tcp.IP.String()
		if tcp.IP.IsUnspecified() {
			host = "127.0.0.1"
		}
		cfg.Advertise = net.JoinHostPort(host, strconv.Itoa(tcp.Port))
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = "mocker-" + strconv.Itoa(tcp.Port)
	}
	cfg.Server.WorkerID, cfg.Server.Address = cfg.WorkerID, cfg.Advertise
	log = log.With("worker", cfg.WorkerID, "pool", cfg.Pool)

	// runCtx is the KV event sinks' lifetime: it ends with the group's
	// tasks, once the HTTP server has drained.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	closeOnStop(cancel)
	g.Go(ctx, "kv events", func(ctx context.Context) error { <-ctx.Done(); cancel(); return nil })

	inst = &Instance{WorkerID: cfg.WorkerID, done: make(chan struct{})}
	dpSize := max(cfg.Server.DPSize, 1)
	var sink mocker.KVSink
	var sinks []mocker.KVSink
	stale := &registry.StaleMarker{Logger: log}
	switch cfg.Events {
	case EventsZMQ:
		// One PUB socket per rank, as vLLM binds one per data-parallel
		// engine: rank r on the endpoint's port + r (a port of 0 picks
		// one for each); each batch carries its rank.
		for r := range dpSize {
			ep, err := offsetEndpoint(cfg.ZMQEndpoint, r)
			if err != nil {
				return nil, fmt.Errorf("mocker: --zmq-endpoint: %w", err)
			}
			z, err := mocker.NewZMQSink(runCtx, ep, cfg.ZMQTopic, engCfg.BlockSize, uint32(r))
			if err != nil {
				return nil, fmt.Errorf("mocker: %w", err)
			}
			closeOnStop(func() { z.Close() })
			if cfg.ZMQReplayEndpoint != "" {
				rep, err := offsetEndpoint(cfg.ZMQReplayEndpoint, r)
				if err != nil {
					return nil, fmt.Errorf("mocker: --zmq-replay-endpoint: %w", err)
				}
				if err := z.ServeReplay(runCtx, rep, 0); err != nil {
					return nil, fmt.Errorf("mocker: %w", err)
				}
			}
			inst.ZMQEndpoints = append(inst.ZMQEndpoints, z.Endpoint())
			inst.ZMQReplayEndpoints = append(inst.ZMQReplayEndpoints, z.ReplayEndpoint())
			sinks = append(sinks, z)
		}
		sink, inst.ZMQEndpoint, inst.ZMQReplayEndpoint = sinks[0], inst.ZMQEndpoints[0], inst.ZMQReplayEndpoints[0]
		if dpSize == 1 {
			sinks = nil
		}
	case EventsNATS:
		nc := deps.NATS
		if nc == nil {
			if cfg.NATSURL == "" {
				return nil, errors.New("mocker: nats events need a NATS URL")
			}
			if nc, err = (runner.NATS{URL: cfg.NATSURL, TLS: cfg.NATSTLS, CredsFile: cfg.NATSCredsFile}).Connect("kvgate-mocker-"+cfg.WorkerID, log); err != nil {
				return nil, fmt.Errorf("mocker: %w", err)
			}
			closeOnStop(nc.Close)
		}
		// A worker that cannot publish marks its registration stale
		// (attached below), so routers stop sending it requests.
		pcfg := kvevents.PublisherConfig{Pool: cfg.Pool, WorkerID: cfg.WorkerID, Logger: log, StaleAfter: cfg.StaleAfter, OnStale: stale.OnStale}
		if deps.Registry != nil { // a typed nil in the interface would be "a registry"
			pcfg.Registerer = deps.Registry
		}
		pub, err := kvevents.NewPublisher(nc, pcfg)
		if err != nil {
			return nil, fmt.Errorf("mocker: %w", err)
		}
		closeOnStop(func() { pub.Close() })
		sink = mocker.PublisherSink{Publisher: pub}
		if dpSize > 1 {
			for r := range dpSize {
				sinks = append(sinks, mocker.PublisherSink{Publisher: pub, DPRank: uint32(r)})
			}
		}
	case EventsNone:
	default:
		return nil, fmt.Errorf("mocker: unknown events mode %q (want zmq, nats or none)", cfg.Events)
	}

	srv, err := mocker.NewServer(cfg.Server, mocker.ServerOptions{Logger: log, Registry: deps.Registry, Sink: sink, Sinks: sinks, Observer: deps.Observer})
	if err != nil {
		return nil, err
	}
	inst.Server, inst.Addr = srv, ln.Addr().String()

	cli := deps.Etcd
	if cli == nil && len(cfg.EtcdEndpoints) > 0 {
		if cli, err = (runner.Etcd{Endpoints: cfg.EtcdEndpoints, TLS: cfg.EtcdTLS}).Client(ctx); err != nil {
			return nil, fmt.Errorf("mocker: %w", err)
		}
		closeOnStop(func() { cli.Close() })
	}
	if cli != nil {
		role := engCfg.Role
		reg, err := registry.Register(ctx, cli, cfg.Pool, membership.WorkerInfo{
			ID: cfg.WorkerID, Address: cfg.Advertise, DPSize: dpSize, BlockSize: engCfg.BlockSize,
			Model: srv.Model(), Role: role, KVCapacityBlocks: engCfg.NumBlocks,
		}, cfg.LeaseTTL, log)
		if err != nil {
			return nil, fmt.Errorf("mocker: %w", err)
		}
		closeOnStop(func() {
			if err := reg.Close(); err != nil {
				log.Warn("deregister", "err", err)
			}
		})
		stale.Attach(reg)
	}

	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	mocker.ConfigureHTTPServer(hs)
	// Kill closes the server under the group: Serve ends with
	// http.ErrServerClosed, which the group does not count as a failure,
	// so the engine, the events and the registration carry on until ctx
	// ends; the group's later Shutdown of a closed server is a no-op.
	inst.kill = func() { _ = hs.Close() }
	g.Go(ctx, "engine", func(ctx context.Context) error { srv.Run(ctx); return nil })
	g.ServeHTTP("serve", hs, ln)
	log.Info("mocker serving", "addr", inst.Addr, "events", cfg.Events, "zmq", inst.ZMQEndpoint,
		"role", engCfg.Role, "block_size", engCfg.BlockSize, "num_blocks", engCfg.NumBlocks, "speedup", engCfg.Speedup)

	go func() {
		defer close(inst.done)
		select {
		case <-ctx.Done():
		case err := <-g.Err():
			inst.err = fmt.Errorf("mocker: %w", err)
		}
		// Connections still open after the drain are closed hard; that
		// is the shutdown's business, not an error of the instance.
		shutCtx, cancelShut := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancelShut()
		_ = g.Stop(shutCtx)
	}()
	return inst, nil
}
