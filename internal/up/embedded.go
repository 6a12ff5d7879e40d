package up

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdServer is an embedded single-member etcd in a temporary directory.
type etcdServer struct {
	e         *embed.Etcd
	dir       string
	endpoints []string
	cli       *clientv3.Client
}

func startEtcd(ctx context.Context, host string) (_ *etcdServer, err error) {
	dir, err := os.MkdirTemp("", "kvgate-up-etcd-")
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	cfg := embed.NewConfig()
	cfg.Name = "kvgate-up"
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true // a throw-away local store
	loop := func() []url.URL { return []url.URL{{Scheme: "http", Host: host + ":0"}} }
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = loop(), loop()
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = loop(), loop()
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("etcd: not ready: %w", ctx.Err())
	}
	s := &etcdServer{e: e, dir: dir}
	for _, l := range e.Clients {
		s.endpoints = append(s.endpoints, "http://"+l.Addr().String())
	}
	s.cli, err = clientv3.New(clientv3.Config{Endpoints: s.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return s, nil
}

func (s *etcdServer) close() error {
	err := s.cli.Close()
	s.e.Close()
	return errors.Join(err, os.RemoveAll(s.dir))
}

func startNATS(host string) (*natsserver.Server, error) {
	s, err := natsserver.NewServer(&natsserver.Options{Host: host, Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats: not ready after 30s")
	}
	return s, nil
}
