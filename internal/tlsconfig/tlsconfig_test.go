package tlsconfig_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/kvgate/kvgate/internal/tlsconfig"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// pki is a CA with files for a server and a client certificate.
type pki struct {
	dir             string
	ca              *tlsconfig.CA
	caFile          string
	srvCert, srvKey string
	cliCert, cliKey string
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	now := time.Now()
	ca, err := tlsconfig.NewCA(name, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := &pki{dir: dir, ca: ca, caFile: filepath.Join(dir, "ca.crt")}
	if err := os.WriteFile(p.caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if p.srvCert, p.srvKey, err = ca.WriteFiles(dir, "server", "server", []string{"localhost", "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if p.cliCert, p.cliKey, err = ca.WriteFiles(dir, "client", "extproc", []string{"extproc.kvgate.svc"}); err != nil {
		t.Fatal(err)
	}
	return p
}

// serve starts a gRPC health server with cfg's TLS and returns its
// address and health server.
func serve(t *testing.T, cfg tlsconfig.Server) (string, *health.Server) {
	t.Helper()
	tc, err := cfg.Config(quiet)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String(), hs
}

// check makes one health call on a new connection with creds.
func check(t *testing.T, addr string, creds credentials.TransportCredentials) (*x509.Certificate, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		t.Fatalf("peer auth info %T, want TLS", p.AuthInfo)
	}
	return ti.State.PeerCertificates[0], nil
}

func clientCreds(t *testing.T, c tlsconfig.Client) credentials.TransportCredentials {
	t.Helper()
	tc, err := c.Config(quiet)
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(tc)
}

func TestHandshakes(t *testing.T) {
	p := newPKI(t, "kvgate test CA")
	other := newPKI(t, "another CA")
	tlsAddr, _ := serve(t, tlsconfig.Server{CertFile: p.srvCert, KeyFile: p.srvKey})
	mtlsAddr, _ := serve(t, tlsconfig.Server{CertFile: p.srvCert, KeyFile: p.srvKey, ClientCAFile: p.caFile})

	tests := []struct {
		name  string
		addr  string
		creds credentials.TransportCredentials
		ok    bool
	}{
		{"good certificate", tlsAddr, clientCreds(t, tlsconfig.Client{CAFile: p.caFile}), true},
		{"wrong CA", tlsAddr, clientCreds(t, tlsconfig.Client{CAFile: other.caFile}), false},
		{"plaintext client to a TLS server", tlsAddr, insecure.NewCredentials(), false},
		{"server name override", tlsAddr, clientCreds(t, tlsconfig.Client{CAFile: p.caFile, ServerName: "localhost"}), true},
		{"wrong server name", tlsAddr, clientCreds(t, tlsconfig.Client{CAFile: p.caFile, ServerName: "elsewhere"}), false},
		{"mTLS with a client certificate", mtlsAddr, clientCreds(t, tlsconfig.Client{CAFile: p.caFile, CertFile: p.cliCert, KeyFile: p.cliKey}), true},
		{"mTLS without a client certificate", mtlsAddr, clientCreds(t, tlsconfig.Client{CAFile: p.caFile}), false},
		{"mTLS with a client certificate of another CA", mtlsAddr, clientCreds(t, tlsconfig.Client{CAFile: p.caFile, CertFile: other.cliCert, KeyFile: other.cliKey}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := check(t, tt.addr, tt.creds)
			if (err == nil) != tt.ok {
				t.Errorf("health check error = %v, want success %v", err, tt.ok)
			}
		})
	}
}

func TestExpiredCertificateRefused(t *testing.T) {
	p := newPKI(t, "kvgate test CA")
	past := time.Now().Add(-48 * time.Hour)
	c, k, err := p.ca.IssuePEM("server", []string{"127.0.0.1"}, past, past.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cf, kf := filepath.Join(p.dir, "old.crt"), filepath.Join(p.dir, "old.key")
	if err := os.WriteFile(cf, c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, k, 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, tlsconfig.Server{CertFile: cf, KeyFile: kf})
	if _, err := check(t, addr, clientCreds(t, tlsconfig.Client{CAFile: p.caFile})); err == nil {
		t.Error("an expired server certificate was accepted")
	}
}

// TestRotationKeepsOpenStreams rewrites the served certificate while a
// stream is open: the stream keeps working on its connection, and new
// handshakes get the new certificate.
func TestRotationKeepsOpenStreams(t *testing.T) {
	p := newPKI(t, "kvgate test CA")
	addr, hs := serve(t, tlsconfig.Server{CertFile: p.srvCert, KeyFile: p.srvKey})
	creds := clientCreds(t, tlsconfig.Client{CAFile: p.caFile})
	before, err := check(t, addr, creds)
	if err != nil {
		t.Fatal(err)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := watch.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch message %v, %v", m, err)
	}

	// Rotate: a new certificate (new serial) in the same files.
	if _, _, err := p.ca.WriteFiles(p.dir, "server", "server-rotated", []string{"localhost", "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	after, err := check(t, addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	if after.SerialNumber.Cmp(before.SerialNumber) == 0 || after.Subject.CommonName != "server-rotated" {
		t.Errorf("new handshake got %s (serial %v), want the rotated certificate", after.Subject.CommonName, after.SerialNumber)
	}

	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if m, err := watch.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("stream after rotation: %v, %v; want it alive with NOT_SERVING", m, err)
	}

	// A broken file keeps the last good certificate.
	if err := os.WriteFile(p.srvCert, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := check(t, addr, creds); err != nil || got.Subject.CommonName != "server-rotated" {
		t.Errorf("after a broken rewrite: %v, %v; want the last good certificate", got, err)
	}
}

func TestSecureServingSelfSigned(t *testing.T) {
	addr, _ := serve(t, tlsconfig.Server{SecureServing: true})
	tc := &tls.Config{InsecureSkipVerify: true} // a self-signed certificate: nothing to verify it against
	if _, err := check(t, addr, credentials.NewTLS(tc)); err != nil {
		t.Errorf("self-signed serving: %v", err)
	}
	if _, err := check(t, addr, insecure.NewCredentials()); err == nil {
		t.Error("plaintext client accepted by a -secure-serving server")
	}
}

func TestConfigErrorsNameTheFile(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  tlsconfig.Server
		want string
	}{
		{"cert without key", tlsconfig.Server{CertFile: "a.crt"}, "-tls-cert-file and -tls-key-file go together"},
		{"missing file", tlsconfig.Server{CertFile: "/nonexistent/a.crt", KeyFile: "/nonexistent/a.key"}, "/nonexistent/a.crt"},
		{"client CA without TLS", tlsconfig.Server{ClientCAFile: "ca.crt"}, "-tls-client-ca-file needs TLS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.cfg.Config(quiet)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := (tlsconfig.Client{CAFile: "/nonexistent/ca.crt"}).Config(quiet); err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.crt") {
		t.Errorf("client CA error %v", err)
	}
}
