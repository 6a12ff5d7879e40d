// Package testenv starts the real servers kvgate's tests run against: an
// embedded etcd and an embedded NATS server, each on a free loopback port
// and stopped by t.Cleanup. It also has the tests' shared helpers: a logger
// to the test's output, polling with a deadline (Eventually) and the
// goroutines goleak must ignore (IgnoreLeaks). Tests use them instead of fakes (STYLE.md,
// "Real transports and real servers").
//
// Both helpers are safe to call from parallel tests; each call starts its
// own server.
//
// Files: testenv.go (embedded etcd and NATS, Eventually), restart.go
// (servers a test stops and restarts on the same port), context.go
// (contexts with the test's deadline), leak.go (IgnoreLeaks).
package testenv

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/kvgate/kvgate/membership"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// StartTimeout bounds how long a server may take to come up.
const StartTimeout = 30 * time.Second

// StartEtcd starts a single-member etcd in a temporary directory, listening
// on free 127.0.0.1 ports, and returns its client endpoints and a client
// connected to it. Both are closed when the test ends.
func StartEtcd(t testing.TB) ([]string, *clientv3.Client) {
	t.Helper()
	endpoints := StartEtcdServer(t)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: StartTimeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if _, err := cli.Get(ctx, "/"); err != nil {
		t.Fatalf("etcd not answering on %v: %v", endpoints, err)
	}
	return endpoints, cli
}

// StartEtcdServer starts the embedded etcd of StartEtcd without a client and
// returns its client endpoints.
func StartEtcdServer(t testing.TB) []string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "testenv"
	cfg.Dir = t.TempDir()
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true
	// Port 0 everywhere: the listeners pick free ports, read back below.
	// Peer URLs only matter for the single member's own bookkeeping.
	loop := func() []url.URL { return []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}} }
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = loop(), loop()
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = loop(), loop()
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("embedded etcd: %v", err)
	case <-time.After(StartTimeout):
		e.Server.Stop()
		t.Fatalf("embedded etcd not ready after %v", StartTimeout)
	}
	endpoints := make([]string, 0, len(e.Clients))
	for _, l := range e.Clients {
		endpoints = append(endpoints, "http://"+l.Addr().String())
	}
	return endpoints
}

// StartNATS starts an embedded NATS server on a free 127.0.0.1 port and
// returns its URL. It is shut down when the test ends.
func StartNATS(t testing.TB) string {
	t.Helper()
	s := StartNATSServer(t)
	return s.ClientURL()
}

// StartNATSServer is StartNATS returning the server itself, for tests that
// stop it or read its state.
func StartNATSServer(t testing.TB) *natsserver.Server {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{
		Host:   "127.0.0.1",
		Port:   -1, // random free port
		NoLog:  true,
		NoSigs: true,
	})
	if err != nil {
		t.Fatalf("embedded nats: %v", err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(StartTimeout) {
		t.Fatalf("embedded nats not ready after %v", StartTimeout)
	}
	return s
}

// ConnectNATS connects to url and closes the connection when the test ends.
func ConnectNATS(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("connect to nats %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Eventually polls cond every few milliseconds until it returns true or
// timeout passes, then fails the test with the last message cond gave.
// cond returns ("", true) when satisfied, or a description of what it saw.
func Eventually(t testing.TB, timeout time.Duration, cond func() (string, bool)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		msg, ok := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %s", timeout, msg)
		}
		time.Sleep(wait) // polling interval, not a wait for a condition
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

// Logger returns a slog logger writing to the test's output (shown on
// failure or with -v), at debug level.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Errorf is a convenience for Eventually conditions.
func Errorf(format string, args ...any) (string, bool) { return fmt.Sprintf(format, args...), false }

// WaitWorkerKey polls etcd until key is present (holding a kvevents
// WorkerInfo at address wantAddr, under a lease) or absent, or ctx ends.
func WaitWorkerKey(ctx context.Context, t testing.TB, cli *clientv3.Client, key string, present bool, wantAddr string) {
	t.Helper()
	for {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if (len(resp.Kvs) == 1) == present {
			if present {
				w, err := membership.ParseWorkerInfo(resp.Kvs[0].Value)
				if err != nil || w.Address != wantAddr || resp.Kvs[0].Lease == 0 {
					t.Fatalf("registered value %s (lease %x): %v", resp.Kvs[0].Value, resp.Kvs[0].Lease, err)
				}
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("key %s present=%v never reached", key, present)
		case <-time.After(20 * time.Millisecond): // polling interval
		}
	}
}
