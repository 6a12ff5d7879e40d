package extprocclient

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// errCloseOK makes the fake end the stream with an OK status.
var errCloseOK = errors.New("close OK")

// respondFunc scripts the fake: for each message received it returns the
// replies to send (none: keep silent) or an error that ends the stream
// (errCloseOK: OK status; a status error: that status).
type respondFunc func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error)

// fakeProcessor is a fake ExternalProcessor server: the one seam the
// client talks to, over a real loopback gRPC listener.
type fakeProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	respond respondFunc

	mu       sync.Mutex
	streams  int
	received []*extprocv3.ProcessingRequest
	// ended receives the error Recv returned when the stream ended from
	// the client's side (CANCELLED when Envoy resets it).
	ended chan error
}

func (f *fakeProcessor) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	f.mu.Lock()
	f.streams++
	f.mu.Unlock()
	for {
		req, err := srv.Recv()
		if err != nil {
			select {
			case f.ended <- err:
			default:
			}
			return nil
		}
		f.mu.Lock()
		f.received = append(f.received, req)
		f.mu.Unlock()
		resps, rerr := f.respond(req)
		for _, r := range resps {
			if err := srv.Send(r); err != nil {
				return nil
			}
		}
		if errors.Is(rerr, errCloseOK) {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

func (f *fakeProcessor) got() []*extprocv3.ProcessingRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), f.received...)
}

func (f *fakeProcessor) streamCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams
}

// startFake serves respond on 127.0.0.1:0 and returns the fake and a
// connection to it; both stop at test cleanup.
func startFake(t *testing.T, respond respondFunc) (*fakeProcessor, *grpc.ClientConn) {
	t.Helper()
	return startFakeB(t, respond)
}

func startFakeB(t testing.TB, respond respondFunc) (*fakeProcessor, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProcessor{respond: respond, ended: make(chan error, 16)}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
	})
	return f, conn
}

func newClient(t *testing.T, conn grpc.ClientConnInterface, cfg Config) *Client {
	t.Helper()
	c, err := New(conn, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// --- reply builders ---

func common(opts ...func(*extprocv3.CommonResponse)) *extprocv3.CommonResponse {
	c := &extprocv3.CommonResponse{}
	for _, o := range opts {
		o(c)
	}
	return c
}

func withMutation(m *extprocv3.HeaderMutation) func(*extprocv3.CommonResponse) {
	return func(c *extprocv3.CommonResponse) { c.HeaderMutation = m }
}

func reqHeadersResp(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: c}}}
}

func respHeadersResp(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: c}}}
}

func reqBodyResp(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: c}}}
}

func respBodyResp(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: c}}}
}

func streamed(body []byte, eos bool) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}
}

func reqTrailersResp(m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{HeaderMutation: m}}}
}

func respTrailersResp(m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{HeaderMutation: m}}}
}

// passAll answers every message with a no-op reply of the matching type,
// echoing bodies in FULL_DUPLEX_STREAMED (as kvgate's server does).
func passAll(mode *extprocfilterv3.ProcessingMode) respondFunc {
	return func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			return one(reqHeadersResp(common())), nil
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			return one(respHeadersResp(common())), nil
		case *extprocv3.ProcessingRequest_RequestBody:
			if mode.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
				return one(reqBodyResp(streamed(r.RequestBody.GetBody(), r.RequestBody.GetEndOfStream()))), nil
			}
			return one(reqBodyResp(common())), nil
		case *extprocv3.ProcessingRequest_ResponseBody:
			if mode.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
				return one(respBodyResp(streamed(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream()))), nil
			}
			return one(respBodyResp(common())), nil
		case *extprocv3.ProcessingRequest_RequestTrailers:
			return one(reqTrailersResp(nil)), nil
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			return one(respTrailersResp(nil)), nil
		}
		return nil, nil
	}
}

func one(r *extprocv3.ProcessingResponse) []*extprocv3.ProcessingResponse {
	return []*extprocv3.ProcessingResponse{r}
}

// kinds summarises the messages a fake received, e.g.
// "request_headers(eos)", "request_body[5](eos)".
func kinds(reqs []*extprocv3.ProcessingRequest) []string {
	var out []string
	for _, r := range reqs {
		var s string
		switch v := r.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			s = "request_headers" + eosMark(v.RequestHeaders.GetEndOfStream())
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			s = "response_headers" + eosMark(v.ResponseHeaders.GetEndOfStream())
		case *extprocv3.ProcessingRequest_RequestBody:
			s = "request_body:" + string(v.RequestBody.GetBody()) + eosMark(v.RequestBody.GetEndOfStream())
		case *extprocv3.ProcessingRequest_ResponseBody:
			s = "response_body:" + string(v.ResponseBody.GetBody()) + eosMark(v.ResponseBody.GetEndOfStream())
		case *extprocv3.ProcessingRequest_RequestTrailers:
			s = "request_trailers"
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			s = "response_trailers"
		}
		out = append(out, s)
	}
	return out
}

func eosMark(eos bool) string {
	if eos {
		return "(eos)"
	}
	return ""
}

func postRequest(body ...string) Request {
	r := Request{Message: Message{Headers: Headers{
		{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "kvgate"}, {":scheme", "http"},
		{"content-type", "application/json"},
	}}}
	n := 0
	for _, b := range body {
		r.Body = append(r.Body, []byte(b))
		n += len(b)
	}
	if len(body) > 0 {
		r.Headers.Add("content-length", itoa(n))
	}
	return r
}

func getRequest() Request {
	return Request{Message: Message{Headers: Headers{
		{":method", "GET"}, {":path", "/v1/models"}, {":authority", "kvgate"}, {":scheme", "http"},
	}}}
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// upstreamOK is an upstream answering 200 with the given body chunks.
func upstreamOK(chunks ...string) func(context.Context, *Message) (*Message, error) {
	return func(context.Context, *Message) (*Message, error) {
		m := &Message{Headers: Headers{{":status", "200"}, {"content-type", "text/event-stream"}}}
		for _, c := range chunks {
			m.Body = append(m.Body, []byte(c))
		}
		return m, nil
	}
}

func mode(f func(m *extprocfilterv3.ProcessingMode)) *extprocfilterv3.ProcessingMode {
	m := &extprocfilterv3.ProcessingMode{}
	f(m)
	return m
}

var fdsBoth = mode(func(m *extprocfilterv3.ProcessingMode) {
	m.RequestBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	m.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
	m.ResponseBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	m.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
})

var _ = proto.Clone
var _ = io.EOF
