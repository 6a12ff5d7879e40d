// Package embedded runs the two servers kvgate depends on inside the
// process: a single-member etcd and a NATS server, each restartable on the
// same address (and, for etcd, the same data directory), so `kvgate up`,
// the chaos bench and the fault tests can take them down and bring them
// back while clients keep their endpoints.
//
// Neither type is safe for concurrent Stop/Start calls; the address
// accessors are.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// StartTimeout bounds how long a server may take to come up.
const StartTimeout = 30 * time.Second

// Etcd is an embedded single-member etcd in its own directory.
type Etcd struct {
	dir       string
	ownDir    bool
	client    url.URL
	peer      url.URL
	endpoints []string

	mu sync.Mutex
	e  *embed.Etcd
}

// StartEtcd starts etcd on host (ports picked by the kernel) in dir; an
// empty dir means a temporary directory removed by Close.
func StartEtcd(ctx context.Context, host, dir string) (*Etcd, error) {
	s := &Etcd{dir: dir}
	if dir == "" {
		d, err := os.MkdirTemp("", "kvgate-etcd-")
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		s.dir, s.ownDir = d, true
	}
	s.client = url.URL{Scheme: "http", Host: net.JoinHostPort(host, "0")}
	s.peer = s.client
	if err := s.start(ctx); err != nil {
		s.removeDir()
		return nil, err
	}
	return s, nil
}

func (s *Etcd) start(ctx context.Context) error {
	cfg := embed.NewConfig()
	cfg.Name = "kvgate"
	cfg.Dir = s.dir
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true // a throw-away local store
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{s.client}, []url.URL{s.client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{s.peer}, []url.URL{s.peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("etcd: not ready: %w", ctx.Err())
	case <-time.After(StartTimeout):
		e.Close()
		return fmt.Errorf("etcd: not ready after %v", StartTimeout)
	}
	// Pin the ports the kernel picked: a restart binds the same ones.
	if len(e.Clients) > 0 {
		s.client.Host = e.Clients[0].Addr().String()
	}
	if len(e.Peers) > 0 {
		s.peer.Host = e.Peers[0].Listener.Addr().String()
	}
	s.mu.Lock()
	s.e = e
	s.endpoints = []string{"http://" + s.client.Host}
	s.mu.Unlock()
	return nil
}

// Endpoints are the client URLs (the same across restarts).
func (s *Etcd) Endpoints() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.endpoints...)
}

// Running reports whether the server is up.
func (s *Etcd) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e != nil
}

// Stop stops the server, keeping its data; idempotent.
func (s *Etcd) Stop() {
	s.mu.Lock()
	e := s.e
	s.e = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped server again on the same ports and data. The
// ports may stay busy for a moment after Stop; it retries until ctx ends.
func (s *Etcd) Restart(ctx context.Context) error {
	if s.Running() {
		return nil
	}
	for {
		err := s.start(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond): // retry interval
		}
	}
}

// Close stops the server and removes a temporary directory.
func (s *Etcd) Close() error {
	s.Stop()
	return s.removeDir()
}

func (s *Etcd) removeDir() error {
	if s.ownDir {
		return os.RemoveAll(s.dir)
	}
	return nil
}

// NATS is an embedded NATS server.
type NATS struct {
	host string
	port int

	mu  sync.Mutex
	srv *natsserver.Server
	url string
}

// StartNATS starts a NATS server on host, port picked by the kernel.
func StartNATS(host string) (*NATS, error) {
	n := &NATS{host: host, port: -1}
	if err := n.start(); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *NATS) start() error {
	srv, err := natsserver.NewServer(&natsserver.Options{Host: n.host, Port: n.port, NoLog: true, NoSigs: true})
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(StartTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return errors.New("nats: not ready after " + StartTimeout.String())
	}
	if a, ok := srv.Addr().(*net.TCPAddr); ok {
		n.port = a.Port
	}
	n.mu.Lock()
	n.srv = srv
	n.url = "nats://" + net.JoinHostPort(n.host, strconv.Itoa(n.port))
	n.mu.Unlock()
	return nil
}

// URL is the client URL (the same across restarts).
func (n *NATS) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.url
}

// Server is the running server, nil while stopped.
func (n *NATS) Server() *natsserver.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Stop shuts the server down (clients see the connection drop and start
// reconnecting); idempotent.
func (n *NATS) Stop() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart starts a stopped server again on the same port, retrying while
// the port is busy until ctx ends.
func (n *NATS) Restart(ctx context.Context) error {
	if n.Server() != nil {
		return nil
	}
	for {
		err := n.start()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond): // retry interval
		}
	}
}

// Close stops the server.
func (n *NATS) Close() { n.Stop() }
