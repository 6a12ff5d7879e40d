package up

import (
	"context"
	"fmt"

	"github.com/kvgate/kvgate/internal/localrouterd"
	"github.com/prometheus/client_golang/prometheus"
)

// Fault controls: the fault tests and `kvgate bench --chaos` take parts of
// a running System down and bring them back. None of them is safe to call
// concurrently with another or with Close.

// RestartRouter starts a stopped local router again (a fresh process: an
// empty index and no requests in flight; it registers in etcd and reloads
// its workers). A running router is stopped first.
func (p *Pool) RestartRouter(ctx context.Context) error {
	if err := p.StopRouter(ctx); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	r, err := localrouterd.Start(ctx, p.rcfg, localrouterd.Deps{Logger: p.log, Registry: reg})
	if err != nil {
		return fmt.Errorf("pool %s: local router: %w", p.Name, err)
	}
	p.Router, p.Registry = r, reg
	p.observeRouter()
	p.stopped.Store(false)
	return nil
}

// RouterStopped reports whether the pool's local router is stopped.
func (p *Pool) RouterStopped() bool { return p.stopped.Load() }

// StopNATS shuts the embedded NATS server down; every client sees its
// connection drop and reconnects once RestartNATS brings it back on the
// same port.
func (s *System) StopNATS() { s.nats.Stop() }

// RestartNATS starts the embedded NATS server again on the same port.
func (s *System) RestartNATS(ctx context.Context) error { return s.nats.Restart(ctx) }

// StopEtcd stops the embedded etcd, keeping its data (leases keep their
// remaining time, as with a real etcd restart).
func (s *System) StopEtcd() { s.etcd.Stop() }

// RestartEtcd starts the embedded etcd again on the same ports and data.
func (s *System) RestartEtcd(ctx context.Context) error { return s.etcd.Restart(ctx) }

// NATSClients is the number of clients connected to the embedded NATS
// server (0 while it is stopped): after RestartNATS, every part is back
// once it reaches the count before StopNATS.
func (s *System) NATSClients() int {
	if srv := s.nats.Server(); srv != nil {
		return srv.NumClients()
	}
	return 0
}
