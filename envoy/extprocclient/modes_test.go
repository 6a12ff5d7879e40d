package extprocclient

import (
	"context"
	"fmt"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/internal/testenv"
)

// TestProcessingModes checks, per processing mode, the messages the server
// receives and what reaches the upstream and the client.
func TestProcessingModes(t *testing.T) {
	withTrailers := func(r Request) Request {
		r.Trailers = Headers{{"x-checksum", "abc"}}
		return r
	}
	tests := []struct {
		name         string
		mode         *extprocfilterv3.ProcessingMode
		req          Request
		upstream     []string // response body chunks
		wantMsgs     []string
		wantUpBody   [][]byte
		wantUpCL     string // content-length upstream ("" = absent)
		wantUpTrail  bool
		wantDownBody string
		wantStreams  int
	}{
		{
			name:         "default GET",
			req:          getRequest(),
			upstream:     []string{"hi"},
			wantMsgs:     []string{"request_headers(eos)", "response_headers"},
			wantDownBody: "hi",
			wantStreams:  1,
		},
		{
			name: "everything skipped opens no stream",
			mode: mode(func(m *extprocfilterv3.ProcessingMode) {
				m.RequestHeaderMode = extprocfilterv3.ProcessingMode_SKIP
				m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
			}),
			req:          postRequest("ab", "cd"),
			upstream:     []string{"hi"},
			wantUpBody:   [][]byte{[]byte("ab"), []byte("cd")},
			wantUpCL:     "4",
			wantDownBody: "hi",
			wantStreams:  0,
		},
		{
			name: "BUFFERED holds headers and sends one body",
			mode: mode(func(m *extprocfilterv3.ProcessingMode) {
				m.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED
				m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
			}),
			req:          postRequest("ab", "cd"),
			upstream:     []string{"hi"},
			wantMsgs:     []string{"request_headers", "request_body:abcd(eos)"},
			wantUpBody:   [][]byte{[]byte("abcd")},
			wantUpCL:     "4",
			wantDownBody: "hi",
			wantStreams:  1,
		},
		{
			name: "BUFFERED with trailers sends the body without end_of_stream",
			mode: mode(func(m *extprocfilterv3.ProcessingMode) {
				m.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED
				m.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
				m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
			}),
			req:          withTrailers(postRequest("ab", "cd")),
			upstream:     []string{"hi"},
			wantMsgs:     []string{"request_headers", "request_body:abcd", "request_trailers"},
			wantUpBody:   [][]byte{[]byte("abcd")},
			wantUpCL:     "4",
			wantUpTrail:  true,
			wantDownBody: "hi",
			wantStreams:  1,
		},
		{
			name: "BUFFERED with headers SKIP removes content-length",
			mode: mode(func(m *extprocfilterv3.ProcessingMode) {
				m.RequestHeaderMode = extprocfilterv3.ProcessingMode_SKIP
				m.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED
				m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
			}),
			req:          postRequest("ab", "cd"),
			upstream:     []string{"hi"},
			wantMsgs:     []string{"request_body:abcd(eos)"},
			wantUpBody:   [][]byte{[]byte("abcd")},
			wantDownBody: "hi",
			wantStreams:  1,
		},
		{
			name: "STREAMED removes content-length",
			mode: mode(func(m *extprocfilterv3.ProcessingMode) {
				m.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
				m.ResponseBodyMode = extprocfilterv3.ProcessingMode_STREAMED
			}),
			req:          postRequest("abcd"),
			upstream:     []string{"hi"},
			wantMsgs:     []string{"request_headers", "request_body:abcd(eos)", "response_headers", "response_body:hi(eos)"},
			wantUpBody:   [][]byte{[]byte("abcd")},
			wantDownBody: "hi",
			wantStreams:  1,
		},
		{
			name:         "FULL_DUPLEX_STREAMED both ways, echoed",
			mode:         fdsBoth,
			req:          postRequest("ab", "cd"),
			upstream:     []string{"h", "i"},
			wantMsgs:     []string{"request_headers", "request_body:ab", "request_body:cd(eos)", "response_headers", "response_body:h", "response_body:i(eos)"},
			wantUpBody:   [][]byte{[]byte("ab"), []byte("cd")},
			wantDownBody: "hi",
			wantStreams:  1,
		},
		{
			name:         "FULL_DUPLEX_STREAMED with trailers: last chunk without end_of_stream, trailers sent",
			mode:         fdsBoth,
			req:          withTrailers(postRequest("ab")),
			upstream:     []string{"hi"},
			wantMsgs:     []string{"request_headers", "request_body:ab", "request_trailers", "response_headers", "response_body:hi(eos)"},
			wantUpBody:   [][]byte{[]byte("ab")},
			wantUpTrail:  true,
			wantDownBody: "hi",
			wantStreams:  1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, conn := startFake(t, passAll(tt.mode))
			c := newClient(t, conn, Config{ProcessingMode: tt.mode})
			req := tt.req
			req.Upstream = upstreamOK(tt.upstream...)
			res, err := c.Process(testenv.Context(t), req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantMsgs, kinds(f.got())); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
			if res.Upstream == nil {
				t.Fatalf("got no upstream request, local reply %+v", res.Info.LocalReply)
			}
			if diff := cmp.Diff(tt.wantUpBody, res.Upstream.Body); diff != "" {
				t.Errorf("upstream body (-want +got):\n%s", diff)
			}
			if cl, _ := res.Upstream.Headers.Get("content-length"); cl != tt.wantUpCL {
				t.Errorf("upstream content-length: got %q, want %q", cl, tt.wantUpCL)
			}
			if got := res.Upstream.Trailers != nil; got != tt.wantUpTrail {
				t.Errorf("upstream trailers present: got %v, want %v", got, tt.wantUpTrail)
			}
			if got := string(res.Downstream.BodyBytes()); got != tt.wantDownBody {
				t.Errorf("downstream body: got %q, want %q", got, tt.wantDownBody)
			}
			if got := f.streamCount(); got != tt.wantStreams {
				t.Errorf("gRPC streams: got %d, want %d", got, tt.wantStreams)
			}
		})
	}
}

// TestFirstMessageFields: protocol_config only on the stream's first
// message, metadata_context (forwarding namespaces only) on every message.
func TestFirstMessageFields(t *testing.T) {
	f, conn := startFake(t, passAll(fdsBoth))
	c := newClient(t, conn, Config{ProcessingMode: fdsBoth, ForwardingNamespaces: []string{"envoy.lb"}})
	req := postRequest("ab")
	req.Metadata = metadata(t, map[string]map[string]any{
		"envoy.lb":    {"x-gateway-destination-endpoint-subset": []any{"10.0.0.1:8000"}},
		"not.forward": {"k": "v"},
	})
	req.Upstream = upstreamOK("x")
	if _, err := c.Process(testenv.Context(t), req); err != nil {
		t.Fatal(err)
	}
	msgs := f.got()
	if len(msgs) < 3 {
		t.Fatalf("got %d messages, want at least 3", len(msgs))
	}
	for i, m := range msgs {
		if got, want := m.GetProtocolConfig() != nil, i == 0; got != want {
			t.Errorf("message %d: protocol_config present %v, want %v", i, got, want)
		}
		md := m.GetMetadataContext().GetFilterMetadata()
		if _, ok := md["envoy.lb"]; !ok || len(md) != 1 {
			t.Errorf("message %d: metadata_context namespaces %v, want only envoy.lb", i, md)
		}
	}
	pc := msgs[0].GetProtocolConfig()
	if pc.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED || pc.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Errorf("protocol_config: got %v", pc)
	}
}

// TestStreamCancelledOnEnd: Envoy ends the stream with a reset, which the
// server sees as CANCELLED.
func TestStreamCancelledOnEnd(t *testing.T) {
	f, conn := startFake(t, passAll(nil))
	c := newClient(t, conn, Config{})
	req := getRequest()
	req.Upstream = upstreamOK("x")
	if _, err := c.Process(testenv.Context(t), req); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-f.ended:
		if code := grpcCode(err); code != "Canceled" {
			t.Errorf("server saw %v, want Canceled", err)
		}
	case <-testenv.Context(t).Done():
		t.Fatal("server never saw the stream end")
	}
}

// TestHeldChunksGoAsOne: data arriving while the header reply is pending is
// held and sent after it as one chunk (the connection manager's buffer).
func TestHeldChunksGoAsOne(t *testing.T) {
	gate := make(chan struct{})
	f, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil {
			<-gate
		}
		return passAll(nil)(req)
	})
	c := newClient(t, conn, Config{ProcessingMode: mode(func(m *extprocfilterv3.ProcessingMode) {
		m.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
		m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
	})})
	ctx := testenv.Context(t)
	s := c.Open(ctx, nil)
	defer s.Close()
	for _, err := range []error{
		s.SendRequestHeaders(ctx, postRequest("abcd").Headers, false),
		s.SendRequestData(ctx, []byte("ab"), false),
		s.SendRequestData(ctx, []byte("cd"), true),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The filter loop took "cd" before the gate opens, so the header reply
	// is handled after both chunks are held.
	close(gate)
	up, err := collect(ctx, s.ReadUpstream)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]byte{[]byte("abcd")}, up.Body); diff != "" {
		t.Errorf("upstream body (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"request_headers", "request_body:abcd(eos)"}, kinds(f.got())); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
}

// TestCloseIsNotAServerError: Close cancels the gRPC stream, whose receive
// goroutine then fails with Canceled; that is the client's own doing, never
// a gRPC error reply (it once showed as a LocalReply 500
// "ext_proc_error_gRPC_error_1{context canceled}" when Process returned
// before the response side started). The receive error and the end of the
// stream's context race, so many exchanges run, concurrently, to give the
// race its chances.
func TestCloseIsNotAServerError(t *testing.T) {
	_, conn := startFake(t, passAll(fdsBoth))
	c := newClient(t, conn, Config{ProcessingMode: fdsBoth})
	ctx := testenv.Context(t)
	const workers, exchanges = 8, 50
	errs := make(chan error, workers)
	for range workers {
		go func() {
			errs <- func() error {
				for i := range exchanges {
					// No Upstream: Process stops once the request is upstream.
					res, err := c.Process(ctx, postRequest(`{"model":"m"}`, `{}`))
					if err != nil {
						return err
					}
					if lr := res.Info.LocalReply; lr != nil {
						return fmt.Errorf("exchange %d: local reply %d %s, want none", i, lr.Status, lr.Details)
					}
					if got := string(res.Upstream.BodyBytes()); got != `{"model":"m"}{}` {
						return fmt.Errorf("exchange %d: upstream body %q", i, got)
					}
				}
				return nil
			}()
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestReceiveErrorAfterContextEnd pins the rule TestCloseIsNotAServerError
// depends on, without the race: a receive error handled once the stream's
// context is done is ignored, whatever the select saw first.
func TestReceiveErrorAfterContextEnd(t *testing.T) {
	_, conn := startFake(t, passAll(fdsBoth))
	c := newClient(t, conn, Config{ProcessingMode: fdsBoth})
	s := c.Open(testenv.Context(t), nil)
	s.Close() // the loop has ended: its state is the test's now
	s.onRecv(recvItem{err: status.FromContextError(context.Canceled).Err()})
	if lr := s.Info().LocalReply; lr != nil {
		t.Errorf("local reply %d %s after the stream's context ended, want none", lr.Status, lr.Details)
	}
}
