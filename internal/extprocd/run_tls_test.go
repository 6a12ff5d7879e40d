package extprocd

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/internal/tlsconfig"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// TestRunTLS runs `kvgate extproc` with -tls-cert-file and -health-addr:
// a client trusting the CA is served, a plaintext client is not, and the
// plaintext health listener answers kubelet-style probes.
func TestRunTLS(t *testing.T) {
	lr := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 1)...)
	dir := t.TempDir()
	cfgFile := writePools(t, dir, lr.Addr)
	now := time.Now()
	ca, err := tlsconfig.NewCA("test CA", now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.WriteFiles(dir, "extproc", "extproc", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags("extproc", []string{"-config", cfgFile, "-config-watch", "-1s", "-tls-cert-file", cert, "-tls-key-file", key,
		"-health-addr", "127.0.0.1:0"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// run opens the health listener itself: give it a port known free.
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.HealthAddr = hl.Addr().String()
	hl.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := startRun(ctx, o, lis, nil)

	health := func(addr string, creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		return err
	}
	tc, err := (tlsconfig.Client{CAFile: caFile}).Config(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := health(lis.Addr().String(), credentials.NewTLS(tc)); err != nil {
		t.Errorf("TLS client: %v", err)
	}
	if err := health(o.HealthAddr, insecure.NewCredentials()); err != nil {
		t.Errorf("plaintext health listener: %v", err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("a plaintext client was served by the TLS ext_proc server")
	}
	ccancel()
	conn.Close()
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}

func TestParseFlagsTLS(t *testing.T) {
	env := map[string]string{"KVGATE_ROUTER_TLS_CA_FILE": "/ca.crt", "KVGATE_ADMIN_ADDR": "127.0.0.1:1"}
	o, err := parseFlags("extproc", []string{"-config", "p.yaml", "-secure-serving", "-router-tls-server-name", "lr.svc", "-metrics-addr", "127.0.0.1:2"},
		func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.TLS.SecureServing || o.RouterTLS.CAFile != "/ca.crt" || o.RouterTLS.ServerName != "lr.svc" || o.MetricsAddr != "127.0.0.1:2" {
		t.Errorf("options %+v", o)
	}
	if o.Addr != "127.0.0.1:9002" {
		t.Errorf("default -addr %q, want loopback 127.0.0.1:9002", o.Addr)
	}
	if _, err := parseFlags("extproc", []string{"-config", "p.yaml", "-tls-cert-file", "a.crt"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("-tls-cert-file without -tls-key-file accepted")
	}
}
