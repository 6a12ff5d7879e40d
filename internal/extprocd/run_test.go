package extprocd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/pool/pooltest"
)

func TestParseFlags(t *testing.T) {
	o, err := ParseFlags("extproc", []string{"-config", "p.yaml", "-addr", ":1234", "-etcd", "http://a:2379, http://b:2379",
		"-request-body-mode", "buffered", "-inference-paths", "/v1/completions,/v2/generate",
		"-shadow-config", "s.yaml", "-otlp-endpoint", "otel:4317", "-otlp-insecure=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.PoolsFile != "p.yaml" || o.Addr != "127.0.0.1:1234" || len(o.Etcd) != 2 || o.Etcd[1] != "http://b:2379" ||
		o.RequestBodyMode != extprocfilterv3.ProcessingMode_BUFFERED || len(o.InferencePaths) != 2 ||
		o.MaxBodyBytes != extproc.DefaultMaxBodyBytes || o.ShadowFile != "s.yaml" || o.OTLPEndpoint != "otel:4317" || o.OTLPInsecure {
		t.Errorf("options %+v", o)
	}
	for _, args := range [][]string{
		{},
		{"-config", "p.yaml", "-request-body-mode", "STREAMED"},
		{"-config", "p.yaml", "-response-body-mode", "nope"},
		{"-config", "p.yaml", "-inference-paths", "v1/x"},
		{"-config", "p.yaml", "-log-level", "loud"},
		{"-config", "p.yaml", "extra"},
	} {
		if _, err := ParseFlags("extproc", args, io.Discard); err == nil {
			t.Errorf("ParseFlags(%q) accepted", args)
		}
	}
	if _, err := ParseFlags("extproc", []string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

// TestRun runs the `kvgate extproc` process on a configuration file naming
// a real local router: it serves health, routes a request, serves metrics,
// and stops cleanly when ctx ends.
func TestRun(t *testing.T) {
	lr := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 2)...)
	cfgFile := writePools(t, t.TempDir(), lr.Addr)
	// A shadow chain runs alongside.
	shadowFile := filepath.Join(t.TempDir(), "shadow.yaml")
	if err := os.WriteFile(shadowFile, []byte("chain: [model-match, kv-overlap]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := ParseFlags("extproc", []string{"-config", cfgFile, "-config-watch", "-1s", "-shadow-config", shadowFile}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := startRun(ctx, o, lis, mlis)

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v, %v", hr, err)
	}
	c, err := extprocclient.New(conn, extprocclient.Config{
		ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND},
		ReceivingNamespaces: []string{"envoy.lb"},
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Process(ctx, extprocclient.Request{Message: extprocclient.Message{
		Headers: extprocclient.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"}},
		Body:    [][]byte{[]byte(`{"model":"m","prompt":"hello there"}`)},
	}, Upstream: func(context.Context, *extprocclient.Message) (*extprocclient.Message, error) {
		return &extprocclient.Message{Headers: extprocclient.Headers{{Key: ":status", Value: "200"}}, Body: [][]byte{[]byte("{}")}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Upstream == nil {
		lr := res.Info.LocalReply
		if lr == nil {
			t.Fatal("the request reached neither the upstream nor a local reply")
		}
		t.Fatalf("the request did not reach the upstream: local reply %d %s: %s", lr.Status, lr.Details, lr.Body)
	}
	if pool, _ := res.Upstream.Headers.Get("x-kvgate-pool"); pool != "pool-a" {
		t.Errorf("x-kvgate-pool %q, want pool-a (info %+v)", pool, res.Info.LocalReply)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+mlis.Addr().String()+"/metrics", nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"kvgate_extproc_requests_total", "kvgate_globalrouter_", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The live status page on the same listener: the pool, its router,
	// the decision explained, the configuration file.
	req, _ = http.NewRequestWithContext(ctx, "GET", "http://"+mlis.Addr().String()+"/kvgate/status/", nil)
	resp, err = (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`id="pool-pool-a"`, lr.Addr, "winner pool-a", cfgFile} {
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("/kvgate/status/ (status %d) lacks %q", resp.StatusCode, want)
		}
	}
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}

// writePools writes dir/pools.yaml naming one pool, pool-a serving model
// m, on the local router at addr, and returns its path.
func writePools(t *testing.T, dir, addr string) string {
	t.Helper()
	cfgFile := filepath.Join(dir, "pools.yaml")
	yaml := fmt.Sprintf("pools:\n  - name: pool-a\n    models: [m]\n    routers:\n      static: [%q]\n", addr)
	if err := os.WriteFile(cfgFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfgFile
}

// startRun runs the `kvgate extproc` process with o on lis (mlis: the
// admin listener, nil for none) until ctx ends or stop is called; stop
// waits for run and returns its error.
func startRun(ctx context.Context, o Options, lis, mlis net.Listener) (stop func() error) {
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, o, slog.New(slog.DiscardHandler), lis, mlis) }()
	return func() error { cancel(); return <-done }
}

// TestRunRefusesEtcdPoolsWithoutEtcd: a pool that discovers its local
// routers in etcd, with no -etcd given, is refused at start naming the
// pool and the flag.
func TestRunRefusesEtcdPoolsWithoutEtcd(t *testing.T) {
	o, err := ParseFlags("extproc", []string{"-config", "../../examples/pools.yaml", "-admin-addr", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, o, slog.New(slog.DiscardHandler), lis, nil)
	if err == nil || !strings.Contains(err.Error(), `pool "pool-b" discovers its local routers in etcd (routers.etcd): give -etcd ENDPOINTS`) {
		t.Errorf("got %v, want the etcd pool refused naming -etcd", err)
	}
}
