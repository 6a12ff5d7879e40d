package runner

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kvgate/kvgate/internal/tlsconfig"
	"github.com/kvgate/kvgate/lib/config"
)

// Etcd is an etcd client's configuration: endpoints and TLS (flags -etcd,
// -etcd-ca-file, -etcd-cert-file, -etcd-key-file).
type Etcd struct {
	Endpoints []string
	TLS       tlsconfig.Client
}

// TLSFlags defines the -etcd-*-file flags on fs (the endpoints flag is the
// subcommand's own: its default differs).
func (e *Etcd) TLSFlags(fs *config.FlagSet) {
	e.TLS.Flags(fs, "etcd", "etcd", false)
}

// Client connects to etcd. ctx bounds nothing but is the client's parent
// context's values (the client lives until Close).
func (e Etcd) Client(ctx context.Context) (*clientv3.Client, error) {
	tc, err := e.TLS.Config(nil)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	cli, err := clientv3.New(EtcdConfig(ctx, e.Endpoints, tc))
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", e.Endpoints, err)
	}
	return cli, nil
}

// EtcdReconnectMax caps the wait between an etcd client's connection
// attempts. gRPC's default grows to 120 s: after a 30 s etcd outage a
// client could stay away for another minute, and its leases (10 s) expire
// although etcd is back. With 1 s a registration re-arms its lease within
// about a second of etcd's return.
const EtcdReconnectMax = time.Second

// EtcdConfig is the etcd client configuration every kvgate client uses:
// endpoints, TLS (nil: plain), reconnection capped at EtcdReconnectMax and
// gRPC keep-alives that notice a dead connection within seconds. ctx's
// values (not its cancellation) are the client's.
func EtcdConfig(ctx context.Context, endpoints []string, tc *tls.Config) clientv3.Config {
	return clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, TLS: tc,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2,
				MaxDelay: EtcdReconnectMax,
			},
			MinConnectTimeout: 2 * time.Second,
		})},
		Context: context.WithoutCancel(ctx), Logger: zap.NewNop(),
	}
}

// NATS is a NATS client's configuration: URL, TLS and credentials (flags
// -nats-ca-file, -nats-cert-file, -nats-key-file, -nats-creds-file; the URL
// flag is the subcommand's own).
type NATS struct {
	URL       string
	TLS       tlsconfig.Client
	CredsFile string
}

// TLSFlags defines the NATS TLS and credentials flags on fs.
func (n *NATS) TLSFlags(fs *config.FlagSet) {
	n.TLS.Flags(fs, "nats", "the NATS servers", false)
	fs.StringVar(&n.CredsFile, "nats-creds-file", n.CredsFile, "NATS credentials file (JWT and NKey seed)")
}

// NATS reconnection, the same for every kvgate client.
const (
	// NATSReconnectWait is the wait between reconnection attempts (with
	// NATSReconnectJitter added at random).
	NATSReconnectWait   = 250 * time.Millisecond
	NATSReconnectJitter = 100 * time.Millisecond
	// NATSReconnectBufSize is how many bytes of publishes a disconnected
	// client buffers (nats.go's default, made explicit); past it publishes
	// fail, which a Publisher counts towards marking its worker stale.
	NATSReconnectBufSize = 8 << 20
)

// Options are the nats.Options of this configuration: TLS, credentials,
// and reconnection forever (nats.MaxReconnects(-1): a router or worker
// outlives any NATS outage; nats.go's default gives up after 60 attempts,
// about 2 minutes) every NATSReconnectWait, buffering NATSReconnectBufSize.
func (n NATS) Options() ([]nats.Option, error) {
	opts := []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(NATSReconnectWait),
		nats.ReconnectJitter(NATSReconnectJitter, NATSReconnectJitter),
		nats.ReconnectBufSize(NATSReconnectBufSize),
	}
	tc, err := n.TLS.Config(nil)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	if n.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	}
	return opts, nil
}

// Connect connects to NATS as name, logging disconnections and
// reconnections on log; extra options come last.
func (n NATS) Connect(name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = slog.Default()
	}
	opts, err := n.Options()
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Name(name),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: we closed it
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("nats reconnected") }),
	)
	nc, err := nats.Connect(n.URL, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", n.URL, err)
	}
	return nc, nil
}
