package up

import (
	"context"
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/internal/embedded"
	"github.com/kvgate/kvgate/internal/runner"
)

// etcdServer is the embedded etcd (restartable on the same port and data)
// and the client the system's parts share.
type etcdServer struct {
	*embedded.Etcd
	endpoints []string
	cli       *clientv3.Client
}

func startEtcd(ctx context.Context, host string) (*etcdServer, error) {
	e, err := embedded.StartEtcd(ctx, host, "")
	if err != nil {
		return nil, err
	}
	s := &etcdServer{Etcd: e, endpoints: e.Endpoints()}
	s.cli, err = (runner.Etcd{Endpoints: s.endpoints}).Client(ctx)
	if err != nil {
		e.Close()
		return nil, err
	}
	return s, nil
}

func (s *etcdServer) close() error {
	err := s.cli.Close()
	return errors.Join(err, s.Etcd.Close())
}
