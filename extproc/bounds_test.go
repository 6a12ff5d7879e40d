package extproc_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/internal/testenv"
)

// gaugeValue reads an unlabelled gauge.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// openRaw opens n ext_proc streams that send nothing, and returns a
// channel receiving each stream's end status (as Recv reports it).
func openRaw(t *testing.T, ctx context.Context, conn grpc.ClientConnInterface, n int) <-chan error {
	t.Helper()
	c := extprocv3.NewExternalProcessorClient(conn)
	ends := make(chan error, n)
	for range n {
		s, err := c.Process(ctx)
		if err != nil {
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
	return ends
}

// baseline connects conn (a health check) and returns the goroutine count
// with the connection up and no stream open.
func baseline(t *testing.T, conn *grpc.ClientConn) int {
	t.Helper()
	if _, err := healthpb.NewHealthClient(conn).Check(testenv.Context(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	return streamGoroutines()
}

// streamGoroutines counts the goroutines running the ext_proc server's or
// these tests' stream code (a frame of package extproc or extproc_test):
// what a stream holds. Goroutines of the process that are not a stream's
// (gRPC's own timers, another test's leftovers ending) are not counted, so
// the count is the streams' alone.
func streamGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "kvgate/kvgate/extproc.") || strings.Contains(g, "kvgate/kvgate/extproc_test.") {
			count++
		}
	}
	return count
}

// waitGoroutines waits until the process runs at most base goroutines
// (each stream's server side and client side ended).
func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		n := streamGoroutines()
		return fmt.Sprintf("%d goroutines running stream code, want at most %d (the baseline)", n, base), n <= base
	})
}

// TestMaxStreams: 3000 silent streams against a bound of 1000: the first
// 1000 are held, 2000 are refused with RESOURCE_EXHAUSTED and counted; once
// the clients leave, every goroutine is gone.
func TestMaxStreams(t *testing.T) {
	conn, reg := startServer(t, extproc.Config{MaxStreams: 1000, RequestTimeout: -1, IdleTimeout: -1}, &deciderDouble{})
	base := baseline(t, conn)
	ctx, cancel := context.WithCancel(testenv.Context(t))
	ends := openRaw(t, ctx, conn, 3000)
	for range 2000 {
		if err := <-ends; status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a stream past -max-streams ended with %v, want RESOURCE_EXHAUSTED", err)
		}
	}
	if got := counterValue(t, reg, "kvgate_extproc_streams_refused_total", "max_streams"); got != 2000 {
		t.Errorf("refused{max_streams} = %v, want 2000", got)
	}
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := gaugeValue(t, reg, "kvgate_extproc_streams_active")
		return fmt.Sprintf("streams_active = %v, want 1000", got), got == 1000
	})
	// The count sees the held streams (so the wait below can fail).
	if n := streamGoroutines(); n < base+1000 {
		t.Errorf("%d goroutines running stream code with 1000 streams held, want at least %d", n, base+1000)
	}
	cancel()
	for range 1000 {
		<-ends
	}
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := gaugeValue(t, reg, "kvgate_extproc_streams_active")
		return fmt.Sprintf("streams_active = %v, want 0", got), got == 0
	})
	waitGoroutines(t, base)
}

// TestRequestTimeout: 3000 streams that never send a request are ended
// with DEADLINE_EXCEEDED by -stream-request-timeout, each counted, and
// every goroutine they held is gone.
func TestRequestTimeout(t *testing.T) {
	conn, reg := startServer(t, extproc.Config{RequestTimeout: 50e6, IdleTimeout: -1}, &deciderDouble{})
	base := baseline(t, conn)
	ends := openRaw(t, testenv.Context(t), conn, 3000)
	for range 3000 {
		if err := <-ends; status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a silent stream ended with %v, want DEADLINE_EXCEEDED", err)
		}
	}
	if got := counterValue(t, reg, "kvgate_extproc_streams_refused_total", "request_timeout"); got != 3000 {
		t.Errorf("refused{request_timeout} = %v, want 3000", got)
	}
	waitGoroutines(t, base)
}

func rawHeaders(path string) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(path)}}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}}
}

func rawBody(b string, end bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: end}}}
}

// TestIdleTimeout: a routed request whose stream then goes silent before
// its response starts is ended by -stream-idle-timeout and its lease freed;
// a request whose response started earlier and was silent longer is not
// cut (a generation may stream for minutes), and ends normally.
func TestIdleTimeout(t *testing.T) {
	d := &deciderDouble{}
	conn, reg := startServer(t, extproc.Config{RequestTimeout: -1, IdleTimeout: 500e6}, d)
	ctx := testenv.Context(t)
	c := extprocv3.NewExternalProcessorClient(conn)
	// Each stream's end, read once its exchange is where the test wants it.
	reader := func(s extprocv3.ExternalProcessor_ProcessClient) <-chan error {
		end := make(chan error, 1)
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					end <- err
					return
				}
			}
		}()
		return end
	}
	open := func() extprocv3.ExternalProcessor_ProcessClient {
		s, err := c.Process(ctx)
		mustOK(t, err)
		mustOK(t, s.Send(rawHeaders("/v1/completions")))
		mustOK(t, s.Send(rawBody(`{"model":"m1","prompt":"hi"}`, true)))
		// FULL_DUPLEX_STREAMED: the header reply, then the body.
		for range 2 {
			_, err := s.Recv()
			mustOK(t, err)
		}
		return s
	}
	// A: routed, its response started (the server answered its response
	// headers), then silent.
	a := open()
	mustOK(t, a.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}}}))
	_, err := a.Recv()
	mustOK(t, err)
	aEnd := reader(a)
	// B: routed after A's last message, then silent before its response.
	bEnd := reader(open())
	if err := <-bEnd; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a silent routed stream ended with %v, want DEADLINE_EXCEEDED", err)
	}
	if got := counterValue(t, reg, "kvgate_extproc_streams_refused_total", "idle_timeout"); got != 1 {
		t.Errorf("refused{idle_timeout} = %v, want 1", got)
	}
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := d.lease(t, 1).calls()
		return fmt.Sprintf("B's lease calls %v, want [free]", got), cmp.Equal(got, []string{"free"})
	})
	select {
	case err := <-aEnd:
		t.Fatalf("a stream whose response had started was ended: %v", err)
	default:
	}
	// A's response ends normally.
	mustOK(t, a.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}}))
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := d.lease(t, 0).calls()
		return fmt.Sprintf("A's lease calls %v, want [prefill free]", got), cmp.Equal(got, []string{"prefill", "free"})
	})
	mustOK(t, a.CloseSend())
	if err := <-aEnd; status.Code(err) != codes.OK && err.Error() != "EOF" {
		t.Errorf("A ended with %v, want EOF", err)
	}
}
