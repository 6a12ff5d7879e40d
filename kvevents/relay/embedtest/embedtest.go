// Package embedtest starts the embedded NATS and etcd servers that
// end-to-end tests of the engine side (relay, publisher, mocker) run
// against: real servers on free loopback ports, stopped by t.Cleanup.
package embedtest

import (
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// NATS starts a NATS server on a free port and returns a connection to it.
func NATS(t testing.TB) (*server.Server, *nats.Conn) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	nc := Connect(t, ns)
	return ns, nc
}

// Connect opens one more connection to ns, closed by t.Cleanup.
func Connect(t testing.TB, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Logger is a slog logger writing to the test's output (shown on failure
// or with -v).
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// IgnoreLeaks lists goroutines that outlive their owners in the libraries
// the engine side uses, for goleak: the embedded etcd's process-wide
// workers, and go-zeromq/zmq4's PUB writer, which Close does not stop (one
// per PUB socket).
func IgnoreLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
		goleak.IgnoreAnyFunction("go.uber.org/zap/zapcore.(*BufferedWriteSyncer).flushLoop"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	}
}

// Etcd starts a single-member etcd in a temporary directory on free ports
// and returns a client to it.
func Etcd(t testing.TB) *clientv3.Client {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	u := func(s string) []url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return []url.URL{*v}
	}
	cfg.ListenClientUrls = u("http://127.0.0.1:0")
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	cfg.ListenPeerUrls = u("http://127.0.0.1:0")
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	cfg.InitialCluster = cfg.Name + "=http://127.0.0.1:0"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + e.Clients[0].Addr().String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
