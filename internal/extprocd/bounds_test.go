package extprocd

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// TestBoundsFlags: the defaults, and each flag read.
func TestBoundsFlags(t *testing.T) {
	o, err := ParseFlags("extproc", []string{"-config", "x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxStreams != extproc.DefaultMaxStreams || o.RequestTimeout != extproc.DefaultRequestTimeout || o.IdleTimeout != extproc.DefaultIdleTimeout {
		t.Errorf("defaults %d %v %v", o.MaxStreams, o.RequestTimeout, o.IdleTimeout)
	}
	o, err = ParseFlags("extproc", []string{"-config", "x", "-max-streams", "7", "-stream-request-timeout", "3s", "-stream-idle-timeout", "-1s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxStreams != 7 || o.RequestTimeout != 3*time.Second || o.IdleTimeout != -time.Second {
		t.Errorf("flags read as %d %v %v", o.MaxStreams, o.RequestTimeout, o.IdleTimeout)
	}
}

// TestBoundsFreeRouterLoad: 200 streams that send a whole request (routed,
// committed on a real local router) and then go silent hold 200 requests
// of load until -stream-idle-timeout ends them; then the router's
// in-flight count is 0 again. (The refusal past -max-streams is
// extproc's TestMaxStreams: here it would race the idle bound.)
func TestBoundsFreeRouterLoad(t *testing.T) {
	const n = 200
	lr := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 2)...)
	cfgFile := writePools(t, t.TempDir(), lr.Addr)
	o, err := ParseFlags("extproc", []string{"-config", cfgFile, "-config-watch", "-1s", "-admin-addr", "",
		"-stream-request-timeout", "-1s", "-stream-idle-timeout", "300ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := startRun(ctx, o, lis, nil)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := extprocv3.NewExternalProcessorClient(conn)
	hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")}}
	ends := make(chan error, n)
	for range n {
		s, err := c.Process(ctx, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m","prompt":"hello there"}`), EndOfStream: true}}}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					ends <- err
					return
				}
			}
		}()
	}
	for range n {
		if err := <-ends; status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a silent routed stream ended with %v, want DEADLINE_EXCEEDED", err)
		}
	}
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatalf("router load after the bound: %v", err)
	}
}
