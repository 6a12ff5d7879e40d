package gateway

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// recordingRouter is fakeRouter that reports, per response-headers message,
// ":status served-endpoint", and each ext_proc stream's end.
type recordingRouter struct {
	extprocv3.UnimplementedExternalProcessorServer
	seen  chan string
	ended chan struct{}
}

func (r recordingRouter) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	defer func() { r.ended <- struct{}{} }()
	return fakeRouter{}.Process(recordingStream{srv, r.seen})
}

type recordingStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	seen chan string
}

func (s recordingStream) Recv() (*extprocv3.ProcessingRequest, error) {
	req, err := s.ExternalProcessor_ProcessServer.Recv()
	if rh := req.GetResponseHeaders(); rh != nil {
		status := ""
		for _, h := range rh.GetHeaders().GetHeaders() {
			if h.GetKey() == ":status" {
				status = string(h.GetRawValue())
			}
		}
		served := req.GetMetadataContext().GetFilterMetadata()["envoy.lb"].GetFields()[ServedHeader].GetStringValue()
		s.seen <- status + " " + served
	}
	return req, err
}

func newRecorder() recordingRouter {
	return recordingRouter{seen: make(chan string, 4), ended: make(chan struct{}, 4)}
}

// TestConnectionFailureReachesTheFilter: a worker that refuses the
// connection gets Envoy's local reply to the client, and the filter sees
// response headers with that 503 and the endpoint tried, so the router
// learns which worker failed.
func TestConnectionFailureReachesTheFilter(t *testing.T) {
	rec := newRecorder()
	down := closedAddr(t)
	url, client := startGatewayWith(t, rec, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	req.Header.Set("x-test-pick", down)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || string(b) != "upstream connect error or disconnect/reset before headers. reset reason: connection failure" {
		t.Errorf("client got %d %q, want Envoy's 503 local reply", resp.StatusCode, b)
	}
	if strings.Contains(string(b), down) {
		t.Errorf("the local reply names the worker's address: %q", b)
	}
	select {
	case got := <-rec.seen:
		if want := "503 " + down; got != want {
			t.Errorf("the filter saw response headers %q, want %q", got, want)
		}
	case <-ctx.Done():
		t.Fatal("the filter never saw the failure")
	}
}

// TestUpstreamResetMidResponse (issue 13 item 3): a worker that dies
// after its first chunk resets the client's stream at once and ends the
// ext_proc stream (so the router frees the request); the client used to
// hang until its own timeout.
func TestUpstreamResetMidResponse(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // the worker dies mid-response
		}
	}))
	defer upstream.Close()
	rec := newRecorder()
	url, client := startGatewayWith(t, rec, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	req.Header.Set("x-test-pick", upstream.Listener.Addr().String())
	// What the filter had not yet released when the worker died is lost,
	// as in Envoy, which resets at once: the client sees the reset before
	// the headers or after some of the body, never a clean end or a hang.
	err := func() error {
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(bufio.NewReader(resp.Body))
		return err
	}()
	switch {
	case ctx.Err() != nil:
		t.Fatal("the client hung until its own timeout")
	case err == nil:
		t.Error("the client's stream ended cleanly; want it reset")
	}
	select {
	case <-rec.ended:
	case <-ctx.Done():
		t.Fatal("the ext_proc stream is still open")
	}
}
