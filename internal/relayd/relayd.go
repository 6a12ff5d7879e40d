// Package relayd is the `kvgate relay` process: the NATS and etcd clients
// (with their TLS), the admin listener (/metrics), around a relay of an
// engine's ZMQ KV events (kvevents/relay).
package relayd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/tlsconfig"
	"github.com/kvgate/kvgate/kvevents/relay"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// ServeConfig is how a standalone relay process reaches its servers.
type ServeConfig struct {
	// NATSURL is the NATS server (nats://127.0.0.1:4222).
	NATSURL string
	// NATSTLS and NATSCredsFile secure the NATS client.
	NATSTLS       tlsconfig.Client
	NATSCredsFile string
	// EtcdEndpoints are needed when relay.Config.Register is set.
	EtcdEndpoints []string
	// EtcdTLS is the etcd client's TLS.
	EtcdTLS tlsconfig.Client
	// MetricsAddr, when set, serves the admin listener (/metrics) there.
	MetricsAddr string
}

// Serve is `kvgate relay`: it dials NATS (and etcd), serves metrics, and
// runs a relay until ctx ends.
func Serve(ctx context.Context, cfg relay.Config, sc ServeConfig, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	if sc.NATSURL == "" {
		sc.NATSURL = nats.DefaultURL
	}
	nc, err := (runner.NATS{URL: sc.NATSURL, TLS: sc.NATSTLS, CredsFile: sc.NATSCredsFile}).Connect("kvgate-relay-"+cfg.Worker.ID, log)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer nc.Close()
	opts := relay.Options{NATS: nc, Logger: log}
	if cfg.Register {
		if len(sc.EtcdEndpoints) == 0 {
			return errors.New("relay: registering the engine needs etcd endpoints")
		}
		cli, err := (runner.Etcd{Endpoints: sc.EtcdEndpoints, TLS: sc.EtcdTLS}).Client(ctx)
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		defer cli.Close()
		opts.Etcd = cli
	}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	r, err := relay.New(cfg, opts)
	if err != nil {
		return err
	}
	g := runner.NewGroup(log)
	if _, err := g.ServeAdmin("admin-addr", sc.MetricsAddr, runner.AdminHandler(reg, nil)); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	g.Go(ctx, "relay", r.Run)
	return g.Run(ctx, 0)
}
