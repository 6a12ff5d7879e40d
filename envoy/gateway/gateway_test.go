package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/envoy/extprocclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRouter is a fake of kvgate's ext_proc server, the seam the gateway
// talks to: it reads the whole request body (FULL_DUPLEX_STREAMED), then
// answers the headers with the endpoint named by the request header
// x-test-pick and, when x-test-pick-metadata is set, that list in the
// envoy.lb metadata (or an immediate response for x-test-immediate), re-emits the
// body, upper-cases the response body and tags the response headers.
type fakeRouter struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (fakeRouter) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	var pick, pickMD, immediate, late string
	var body []byte
	for {
		req, err := srv.Recv()
		if err != nil {
			return nil
		}
		var out []*extprocv3.ProcessingResponse
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			for _, h := range r.RequestHeaders.GetHeaders().GetHeaders() {
				switch h.GetKey() {
				case "x-test-pick":
					pick = string(h.GetRawValue())
				case "x-test-pick-metadata":
					pickMD = string(h.GetRawValue())
				case "x-test-immediate":
					immediate = string(h.GetRawValue())
				case "x-test-late-immediate":
					late = string(h.GetRawValue())
				}
			}
			if r.RequestHeaders.GetEndOfStream() {
				out = append(out, pickResponse(pick, pickMD, immediate))
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.GetBody()...)
			switch {
			case r.RequestBody.GetEndOfStream() && late != "":
				// Headers released upstream first, then the body refused.
				out = append(out, pickResponse(pick, pickMD, ""), pickResponse("", "", late))
			case r.RequestBody.GetEndOfStream():
				out = append(out, pickResponse(pick, pickMD, immediate), streamedResp(true, body, true))
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			out = append(out, pickResponse(pick, pickMD, immediate), streamedResp(true, body, false),
				&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			served := req.GetMetadataContext().GetFilterMetadata()["envoy.lb"].GetFields()[ServedHeader].GetStringValue()
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					{Header: &corev3.HeaderValue{Key: "x-kvgate-pool", RawValue: []byte("pool-a")}},
					{Header: &corev3.HeaderValue{Key: "x-test-served", RawValue: []byte(served)}},
				}}},
			}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, streamedResp(false, bytes.ToUpper(r.ResponseBody.GetBody()), r.ResponseBody.GetEndOfStream()))
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
		}
		for _, o := range out {
			if err := srv.Send(o); err != nil {
				return nil
			}
		}
	}
}

func pickResponse(pick, pickMD, immediate string) *extprocv3.ProcessingResponse {
	if immediate != "" {
		code, _ := strconv.Atoi(immediate)
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-kvgate-dropped-reason", RawValue: []byte("saturated")}}}},
			Body:    []byte(`{"error":{"message":"saturated","type":"rate_limit","code":429}}`),
		}}}
	}
	var set []*corev3.HeaderValueOption
	if pick != "" {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte(pick)}})
	}
	var md *structpb.Struct
	if pickMD != "" {
		md = &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStructValue(&structpb.Struct{
			Fields: map[string]*structpb.Value{DestinationHeader: structpb.NewStringValue(pickMD)},
		})}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}, ClearRouteCache: true},
	}}, DynamicMetadata: md}
}

func streamedResp(request bool, body []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// startGateway serves a gateway in front of the fake ext_proc server (or
// an unreachable one) and returns its URL and an HTTP client.
func startGateway(t *testing.T, reachable bool, opts ...func(*Config)) (string, *http.Client) {
	t.Helper()
	return startGatewayWith(t, fakeRouter{}, reachable, opts...)
}

// startGatewayWith is startGateway in front of the ext_proc server impl.
func startGatewayWith(t *testing.T, impl extprocv3.ExternalProcessorServer, reachable bool, opts ...func(*Config)) (string, *http.Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, impl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	if !reachable {
		srv.Stop()
		<-done
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := DefaultConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(&cfg)
	}
	gw, err := New(conn, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(gw)
	ConfigureServer(front.Config) // HTTP/1.1 and h2c, as the gateway runs
	front.Start()
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		front.Close()
		gw.Close()
		conn.Close()
		if reachable {
			srv.Stop()
			<-done
		}
	})
	return front.URL, client
}

// upstream is a worker: it records what it got and answers with the body
// "hello", a trailer x-usage, and the request trailer it saw.
type seen struct {
	header  http.Header
	body    string
	trailer string
}

func startUpstream(t *testing.T) (string, chan seen) {
	t.Helper()
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case got <- seen{header: r.Header.Clone(), body: string(b), trailer: r.Trailer.Get("X-Checksum")}:
		default: // only the first request is inspected
		}
		w.Header().Set("Trailer", "X-Usage")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "hello")
		w.Header().Set("X-Usage", "5")
	}))
	t.Cleanup(up.Close)
	return up.Listener.Addr().String(), got
}

func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestGateway(t *testing.T) {
	good, _ := startUpstream(t)
	down := closedAddr(t)
	tests := []struct {
		name        string
		method      string
		pick        string
		pickMD      string
		immediate   string
		late        string
		reqTrailer  bool
		unreachable bool
		defaultUp   string
		wantStatus  int
		wantBody    string
		wantHeader  map[string]string
		wantTrailer string
	}{
		{name: "POST proxied, response through ext_proc", method: "POST", pick: good, wantStatus: 200, wantBody: "HELLO",
			wantHeader: map[string]string{"X-Kvgate-Pool": "pool-a", "Content-Type": "text/event-stream"}, wantTrailer: "5"},
		{name: "GET without body", method: "GET", pick: good, wantStatus: 200, wantBody: "HELLO", wantTrailer: "5"},
		{name: "request trailers reach the upstream", method: "POST", pick: good, reqTrailer: true, wantStatus: 200, wantBody: "HELLO", wantTrailer: "5"},
		{name: "fallback on connection failure", method: "POST", pick: down + "," + good, wantStatus: 200, wantBody: "HELLO", wantTrailer: "5",
			wantHeader: map[string]string{"X-Test-Served": good}},
		{name: "fallback from the envoy.lb list, primary alone in the header", method: "POST", pick: down, pickMD: down + "," + good,
			wantStatus: 200, wantBody: "HELLO", wantTrailer: "5", wantHeader: map[string]string{"X-Test-Served": good}},
		{name: "envoy.lb list without the header", method: "POST", pickMD: down + "," + good,
			wantStatus: 200, wantBody: "HELLO", wantTrailer: "5", wantHeader: map[string]string{"X-Test-Served": good}},
		{name: "immediate response", method: "POST", pick: good, immediate: "429", wantStatus: 429,
			wantBody: `{"error":{"message":"saturated","type":"rate_limit","code":429}}`, wantHeader: map[string]string{"X-Kvgate-Dropped-Reason": "saturated"}},
		{name: "immediate response after the headers went upstream", method: "POST", pick: good, late: "413", wantStatus: 413,
			wantBody: `{"error":{"message":"saturated","type":"rate_limit","code":429}}`},
		{name: "no endpoint", method: "POST", wantStatus: 503, wantBody: "no healthy upstream"},
		{name: "no endpoint, default upstream", method: "GET", defaultUp: good, wantStatus: 200, wantBody: "HELLO", wantTrailer: "5"},
		{name: "a destination wins over the default upstream", method: "POST", pick: down, defaultUp: good, wantStatus: 503,
			wantBody: "upstream connect error or disconnect/reset before headers. reset reason: connection failure"},
		{name: "every endpoint down", method: "POST", pick: down, wantStatus: 503,
			wantBody: "upstream connect error or disconnect/reset before headers. reset reason: connection failure"},
		{name: "ext_proc unreachable fails closed", method: "POST", pick: good, unreachable: true, wantStatus: 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, client := startGateway(t, !tt.unreachable, func(c *Config) { c.DefaultUpstream = tt.defaultUp })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var body io.Reader
			if tt.method == "POST" {
				body = strings.NewReader(`{"model":"m","prompt":"hi"}`)
			}
			req, err := http.NewRequestWithContext(ctx, tt.method, url+"/v1/completions", body)
			if err != nil {
				t.Fatal(err)
			}
			if tt.reqTrailer {
				req.ContentLength = -1
				req.Trailer = http.Header{"X-Checksum": []string{"abc"}}
			}
			if tt.pick != "" {
				req.Header.Set("x-test-pick", tt.pick)
			}
			if tt.pickMD != "" {
				req.Header.Set("x-test-pick-metadata", tt.pickMD)
			}
			if tt.immediate != "" {
				req.Header.Set("x-test-immediate", tt.immediate)
			}
			if tt.late != "" {
				req.Header.Set("x-test-late-immediate", tt.late)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status: got %d, want %d (body %q)", resp.StatusCode, tt.wantStatus, b)
			}
			if tt.wantBody != "" && string(b) != tt.wantBody {
				t.Errorf("body: got %q, want %q", b, tt.wantBody)
			}
			for k, v := range tt.wantHeader {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("header %s: got %q, want %q", k, got, v)
				}
			}
			if got := resp.Trailer.Get("X-Usage"); got != tt.wantTrailer {
				t.Errorf("trailer X-Usage: got %q, want %q", got, tt.wantTrailer)
			}
		})
	}
}

// TestGatewayUpstreamSees: the worker gets the body as the ext_proc server
// re-emitted it, the routing header, x-request-id, and request trailers.
func TestGatewayUpstreamSees(t *testing.T) {
	good, got := startUpstream(t)
	url, client := startGateway(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1
	req.Trailer = http.Header{"X-Checksum": []string{"abc"}}
	req.Header.Set("x-test-pick", good)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s := <-got
	want := seen{body: `{"a":1}`, trailer: "abc"}
	if diff := cmp.Diff(want, seen{body: s.body, trailer: s.trailer}, cmp.AllowUnexported(seen{})); diff != "" {
		t.Errorf("upstream saw (-want +got):\n%s", diff)
	}
	if s.header.Get(DestinationHeader) != good || s.header.Get("X-Request-Id") == "" || s.header.Get("X-Forwarded-Proto") != "http" {
		t.Errorf("upstream headers: got %v", s.header)
	}
}

// TestGatewayStreams: the first response chunk reaches the client while the
// worker is still generating (no buffering anywhere on the way).
func TestGatewayStreams(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: [done]\n\n")
	}))
	defer up.Close()
	url, client := startGateway(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-test-pick", up.Listener.Addr().String())
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	// Upper-cased by the fake's response path.
	if line != "DATA: FIRST\n" {
		t.Errorf("first line: got %q", line)
	}
	close(release)
	rest, err := io.ReadAll(rd)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if string(rest) != "\nDATA: [DONE]\n\n" {
		t.Errorf("rest: got %q", rest)
	}
}

// TestGatewayHeadersBeforeBody: the response headers reach the client as
// soon as the upstream sent them and the filter passed them, before any
// body (Envoy's router filter encodes headers downstream at once); the
// upstream here sends no body until the client has its headers.
func TestGatewayHeadersBeforeBody(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: first\n\n")
	}))
	defer up.Close()
	url, client := startGateway(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-test-pick", up.Listener.Addr().String())
	resp, err := client.Do(req) // would wait for the body, which waits for this
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("got %d %v", resp.StatusCode, resp.Header)
	}
	close(release)
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != "DATA: FIRST\n\n" {
		t.Errorf("body %q", body)
	}
}

func TestDestinations(t *testing.T) {
	for _, tc := range []struct {
		name, header, metadata string
		want                   []string
	}{
		{"header alone", "10.0.0.1:8000", "", []string{"10.0.0.1:8000"}},
		{"header list", "10.0.0.1:8000,10.0.0.2:8000", "", []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"kvgate's default: primary in the header, list in the metadata", "10.0.0.1:8000", "10.0.0.1:8000, 10.0.0.2:8000",
			[]string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"same list both ways", "10.0.0.1:8000,10.0.0.2:8000", "10.0.0.1:8000,10.0.0.2:8000", []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"shorter metadata: the header wins", "10.0.0.1:8000,10.0.0.2:8000", "10.0.0.9:8000", []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"metadata alone", "", "10.0.0.1:8000,10.0.0.2:8000", []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"neither", "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h extprocclient.Headers
			if tc.header != "" {
				h = extprocclient.Headers{{Key: DestinationHeader, Value: tc.header}}
			}
			var info extprocclient.Info
			if tc.metadata != "" {
				info.DynamicMetadata = map[string]*structpb.Struct{"envoy.lb": {Fields: map[string]*structpb.Value{
					DestinationHeader: structpb.NewStringValue(tc.metadata),
				}}}
			}
			if diff := cmp.Diff(tc.want, destinations(h, info)); diff != "" {
				t.Errorf("destinations (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzDestinations parses the destination header an ext_proc server set.
func FuzzDestinations(f *testing.F) {
	f.Add("10.0.0.1:8000")
	f.Add(" 10.0.0.1:8000, ,[::1]:9000,")
	f.Fuzz(func(t *testing.T, v string) {
		for _, ep := range destinations(extprocclient.Headers{{Key: DestinationHeader, Value: v}}, extprocclient.Info{}) {
			if ep == "" || strings.Contains(ep, ",") || strings.TrimSpace(ep) != ep {
				t.Fatalf("bad endpoint %q from %q", ep, v)
			}
		}
	})
}

// TestGatewayH2C: a streaming request over h2c (prior knowledge) to the
// gateway's listener, proxied over h2c to an upstream that speaks only
// h2c, as an Envoy listener with codec_type AUTO and a cluster with
// http2_protocol_options do; both hops must be HTTP/2.
func TestGatewayH2C(t *testing.T) {
	var h2only http.Protocols
	h2only.SetUnencryptedHTTP2(true)
	release := make(chan struct{})
	upProto := make(chan int, 1)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upProto <- r.ProtoMajor
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: [done]\n\n")
	}))
	up.Config.Protocols = &h2only
	up.Start()
	defer up.Close()
	url, _ := startGateway(t, true, func(c *Config) { c.UpstreamHTTP2 = true })
	tr := &http.Transport{Protocols: &h2only}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-test-pick", up.Listener.Addr().String())
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("downstream protocol: got %s, want HTTP/2", resp.Proto)
	}
	if p := <-upProto; p != 2 {
		t.Errorf("upstream protocol: got HTTP/%d, want HTTP/2", p)
	}
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if line != "DATA: FIRST\n" {
		t.Errorf("first line: got %q", line)
	}
	close(release)
	rest, err := io.ReadAll(rd)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if string(rest) != "\nDATA: [DONE]\n\n" {
		t.Errorf("rest: got %q", rest)
	}
}
