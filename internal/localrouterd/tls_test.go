package localrouterd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/tlsconfig"
)

// testPKI writes a CA, a server certificate and client certificates named
// as given into a temporary folder.
type testPKI struct {
	dir, caFile, srvCert, srvKey string
	clients                      map[string][2]string
}

func newTestPKI(t *testing.T, clients ...string) *testPKI {
	t.Helper()
	now := time.Now()
	ca, err := tlsconfig.NewCA("test CA", now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), clients: map[string][2]string{}}
	p.caFile = filepath.Join(p.dir, "ca.crt")
	if err := os.WriteFile(p.caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if p.srvCert, p.srvKey, err = ca.WriteFiles(p.dir, "server", "localrouter", []string{"127.0.0.1", "localhost"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		cf, kf, err := ca.WriteFiles(p.dir, c, c, []string{c + ".kvgate.svc"})
		if err != nil {
			t.Fatal(err)
		}
		p.clients[c] = [2]string{cf, kf}
	}
	return p
}

func (p *testPKI) dial(t *testing.T, addr, client string) localrouterv1.LocalRouterClient {
	t.Helper()
	c := tlsconfig.Client{CAFile: p.caFile}
	if client != "" {
		c.CertFile, c.KeyFile = p.clients[client][0], p.clients[client][1]
	}
	tc, err := c.Config(nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return localrouterv1.NewLocalRouterClient(conn)
}

// TestMutualTLSAuthorisesLifecycleCalls runs a local router under mutual
// TLS with an allow-list: the allowed client makes lifecycle calls, another
// client of the same CA is refused them with PermissionDenied naming the
// rule but may probe, a client without a certificate or in plaintext gets
// nothing, and the plaintext health listener answers probes.
func TestMutualTLSAuthorisesLifecycleCalls(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	p := newTestPKI(t, "extproc", "intruder")
	cfg := e.config("mtls")
	cfg.TLS = tlsconfig.Server{CertFile: p.srvCert, KeyFile: p.srvKey, ClientCAFile: p.caFile}
	cfg.AuthorizedClients = []string{"extproc.kvgate.svc"}
	cfg.HealthAddr = "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	svc, err := Start(ctx, cfg, Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close(context.Background())
	if svc.anon != nil {
		t.Error("callers identified by mutual TLS got the anonymous-commit expiry")
	}

	allowed := p.dial(t, svc.GRPCAddr(), "extproc")
	// An unknown id gets past authorisation to the handler's NotFound.
	if _, err := allowed.Free(ctx, &localrouterv1.FreeRequest{RequestId: "r1"}); status.Code(err) != codes.NotFound {
		t.Errorf("allowed Free of an unknown id: %v, want NotFound from the handler", err)
	}
	if _, err := allowed.DumpEvents(ctx, &localrouterv1.DumpEventsRequest{}); err != nil {
		t.Errorf("allowed DumpEvents: %v", err)
	}

	intruder := p.dial(t, svc.GRPCAddr(), "intruder")
	refused := func(name string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "-authorized-clients") {
			t.Errorf("intruder %s: %v, want PermissionDenied naming -authorized-clients", name, err)
		}
	}
	_, err = intruder.Free(ctx, &localrouterv1.FreeRequest{RequestId: "r1"})
	refused("Free", err)
	_, err = intruder.Commit(ctx, &localrouterv1.CommitRequest{RequestId: "r2"})
	refused("Commit", err)
	_, err = intruder.MarkPrefillComplete(ctx, &localrouterv1.MarkPrefillCompleteRequest{RequestId: "r1"})
	refused("MarkPrefillComplete", err)
	_, err = intruder.DumpEvents(ctx, &localrouterv1.DumpEventsRequest{})
	refused("DumpEvents", err)
	if tr, err := intruder.Track(ctx); err != nil {
		refused("Track", err)
	} else {
		_, err = tr.Recv()
		refused("Track", err)
	}
	// A BestWorker that records its request or the approximate index is a
	// commit in a probe's clothing.
	_, err = intruder.BestWorker(ctx, &localrouterv1.BestWorkerRequest{Prompt: &localrouterv1.Prompt{TokenIds: []uint32{1, 2, 3}}, RequestId: "phantom"})
	refused("BestWorker with a request id", err)
	_, err = intruder.BestWorker(ctx, &localrouterv1.BestWorkerRequest{Prompt: &localrouterv1.Prompt{TokenIds: []uint32{1, 2, 3}}, UpdateIndexer: true})
	refused("BestWorker updating the indexer", err)
	if _, err := intruder.BestWorker(ctx, &localrouterv1.BestWorkerRequest{Prompt: &localrouterv1.Prompt{TokenIds: []uint32{1, 2, 3}}}); status.Code(err) == codes.PermissionDenied {
		t.Errorf("intruder BestWorker (a pure probe): %v, want it past authorisation", err)
	}
	if _, err := intruder.Workers(ctx, &localrouterv1.WorkersRequest{}); err != nil {
		t.Errorf("intruder Workers (a probe): %v", err)
	}
	if _, err := intruder.Stats(ctx, &localrouterv1.StatsRequest{}); err != nil {
		t.Errorf("intruder Stats (a probe): %v", err)
	}

	if _, err := p.dial(t, svc.GRPCAddr(), "").Workers(ctx, &localrouterv1.WorkersRequest{}); err == nil {
		t.Error("a client without a certificate was served under mutual TLS")
	}
	plain, err := grpc.NewClient(svc.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := localrouterv1.NewLocalRouterClient(plain).Workers(ctx, &localrouterv1.WorkersRequest{}); err == nil {
		t.Error("a plaintext client was served by a TLS router")
	}

	hc, err := grpc.NewClient(svc.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	if _, err := healthpb.NewHealthClient(hc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("plaintext health listener: %v", err)
	}
}

func TestAuthorizedClientsNeedMutualTLS(t *testing.T) {
	c := DefaultConfig()
	c.Pool, c.RouterID, c.Etcd, c.NATS = "p", "r", []string{"e:1"}, "n"
	c.AuthorizedClients = []string{"extproc"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "-tls-client-ca-file") {
		t.Errorf("Validate = %v, want an error naming -tls-client-ca-file", err)
	}
}
