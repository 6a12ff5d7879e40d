package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// TestSecureServing runs `kvgate up -secure-serving`: requests route over
// TLS to ext_proc and mutual TLS to the local routers (lifecycle calls
// authorised by the global router's certificate, so loads return to zero),
// the CA file is printed, and a plaintext client of a local router is
// refused.
func TestSecureServing(t *testing.T) {
	t.Parallel()
	s := startSystem(t, func(c *up.Config) { c.SecureServing = true })
	if s.CAFile == "" || !strings.Contains(s.Summary(), s.CAFile) {
		t.Fatalf("CA file %q not in the summary:\n%s", s.CAFile, s.Summary())
	}
	if _, err := os.Stat(s.CAFile); err != nil {
		t.Fatalf("CA file: %v", err)
	}
	// The client certificate a local router's mutual TLS asks for is
	// printed too, and with it (and the CA) a client reads a local router.
	if s.ClientCertFile == "" || !strings.Contains(s.Summary(), s.ClientCertFile) || !strings.Contains(s.Summary(), s.ClientKeyFile) {
		t.Fatalf("client certificate %q, key %q not in the summary:\n%s", s.ClientCertFile, s.ClientKeyFile, s.Summary())
	}
	cert, err := tls.LoadX509KeyPair(s.ClientCertFile, s.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(s.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS12}
	mtls, err := grpc.NewClient(s.Pools[0].Router.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer mtls.Close()
	if _, err := localrouterv1.NewLocalRouterClient(mtls).Workers(testenv.ContextWithTimeout(t, testTimeout), &localrouterv1.WorkersRequest{}); err != nil {
		t.Errorf("Workers with the printed client certificate: %v", err)
	}
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	r := chat(t, ctx, httpClient(t), s, chatBody("mock-llama", "Tell me about KV caches.", true, 4))
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	waitIdle(t, s)

	conn, err := grpc.NewClient(s.Pools[0].Router.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := localrouterv1.NewLocalRouterClient(conn).Free(ctx, &localrouterv1.FreeRequest{RequestId: "x"}); err == nil {
		t.Error("a plaintext Free reached a local router of a secure system")
	}
}

// TestStatusOnlyOnAdminListener: the status page, status.json (internal
// addresses) and metrics are served on the admin listener, not on the
// gateway's public port.
func TestStatusOnlyOnAdminListener(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	for _, path := range []string{"/kvgate/", "/kvgate/status.json", "/kvgate/metrics"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", s.GatewayURL()+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 || strings.Contains(string(b), s.EtcdEndpoints()[0]) || strings.Contains(string(b), "kvgate_extproc") {
			t.Errorf("gateway GET %s: %d %.200s; want it not served there", path, resp.StatusCode, b)
		}
	}
}
