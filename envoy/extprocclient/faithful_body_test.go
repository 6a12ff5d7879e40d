package extprocclient

import (
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/internal/testenv"
)

// §6.6: content-length removed where Envoy removes it; BUFFERED with
// headers SEND checks it against the mutated body.
func TestContentLength(t *testing.T) {
	setCL := func(v string) *extprocv3.HeaderMutation {
		return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-length", "", v, nil)}}
	}
	bodyMut := func(b string) *extprocv3.BodyMutation {
		return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(b)}}
	}
	buffered := mode(func(m *extprocfilterv3.ProcessingMode) {
		m.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED
		m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
	})
	streamedMode := mode(func(m *extprocfilterv3.ProcessingMode) {
		m.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
		m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
	})
	tests := []struct {
		name       string
		mode       *extprocfilterv3.ProcessingMode
		headers    *extprocv3.CommonResponse
		body       *extprocv3.CommonResponse
		wantCL     string
		wantBody   string
		wantStatus int
	}{
		{"STREAMED removes it", streamedMode, common(), common(), "", "abcd", 0},
		{"STREAMED skips a server's content-length", streamedMode, common(withMutation(setCL("4"))), common(), "", "abcd", 0},
		{"BUFFERED keeps a matching one", buffered, common(), common(), "4", "abcd", 0},
		{"BUFFERED mutated body with stale length is an error", buffered, common(), &extprocv3.CommonResponse{BodyMutation: bodyMut("xyz")}, "", "", 500},
		{"BUFFERED fixed in the same body reply", buffered, common(), &extprocv3.CommonResponse{BodyMutation: bodyMut("xyz"), HeaderMutation: setCL("3")}, "3", "xyz", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				switch {
				case req.GetRequestHeaders() != nil:
					return one(reqHeadersResp(tt.headers)), nil
				case req.GetRequestBody() != nil:
					return one(reqBodyResp(tt.body)), nil
				}
				return nil, nil
			})
			c := newClient(t, conn, Config{ProcessingMode: tt.mode})
			res, err := c.Process(testenv.Context(t), postRequest("abcd"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantStatus != 0 {
				if res.Info.LocalReply == nil || res.Info.LocalReply.Status != tt.wantStatus {
					t.Fatalf("got local reply %+v, want %d", res.Info.LocalReply, tt.wantStatus)
				}
				return
			}
			if res.Upstream == nil {
				t.Fatalf("no upstream request, local reply %+v", res.Info.LocalReply)
			}
			if cl, _ := res.Upstream.Headers.Get("content-length"); cl != tt.wantCL {
				t.Errorf("content-length: got %q, want %q", cl, tt.wantCL)
			}
			if got := string(res.Upstream.BodyBytes()); got != tt.wantBody {
				t.Errorf("body: got %q, want %q", got, tt.wantBody)
			}
		})
	}
}

// §6.8: in BUFFERED and STREAMED the body waits for the header reply (the
// next message the server sees is the response's headers, fed after the
// body); a BUFFERED body followed by trailers has end_of_stream=false.
func TestBodyWaitsForHeaderReply(t *testing.T) {
	for _, bm := range []extprocfilterv3.ProcessingMode_BodySendMode{extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED} {
		t.Run(bm.String(), func(t *testing.T) {
			second := make(chan string, 1)
			n := 0
			_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				n++
				if n == 2 {
					second <- kinds([]*extprocv3.ProcessingRequest{req})[0]
				}
				return nil, nil // never answer the request headers
			})
			c := newClient(t, conn, Config{ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: bm}})
			ctx := testenv.Context(t)
			s := c.Open(ctx, nil)
			defer s.Close()
			req := postRequest("ab")
			for _, err := range []error{
				s.SendRequestHeaders(ctx, req.Headers, false),
				s.SendRequestData(ctx, []byte("ab"), true),
				s.SendResponseHeaders(ctx, Headers{{":status", "200"}}, true),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			select {
			case got := <-second:
				if got != "response_headers(eos)" {
					t.Errorf("second message: got %s, want response_headers(eos)", got)
				}
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		})
	}
	t.Run("BUFFERED body before trailers", func(t *testing.T) {
		f, conn := startFake(t, passAll(nil))
		m := mode(func(m *extprocfilterv3.ProcessingMode) {
			m.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED
			m.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
		})
		c := newClient(t, conn, Config{ProcessingMode: m})
		req := postRequest("ab")
		req.Trailers = Headers{{"x-t", "1"}}
		if _, err := c.Process(testenv.Context(t), req); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"request_headers", "request_body:ab", "request_trailers"}, kinds(f.got())); diff != "" {
			t.Errorf("messages (-want +got):\n%s", diff)
		}
	})
}

// §6.10: a STREAMED body reply's header_mutation is ignored; STREAMED
// chunks are pipelined and released only as their replies arrive.
func TestStreamedBodyReplies(t *testing.T) {
	var mu sync.Mutex
	var held []*extprocv3.ProcessingRequest
	_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		switch {
		case req.GetRequestHeaders() != nil:
			return one(reqHeadersResp(common())), nil
		case req.GetRequestBody() != nil:
			mu.Lock()
			defer mu.Unlock()
			held = append(held, req)
			if !req.GetRequestBody().GetEndOfStream() {
				return nil, nil // pipelined: answer both once the last arrives
			}
			var out []*extprocv3.ProcessingResponse
			for range held {
				out = append(out, reqBodyResp(common(withMutation(&extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{setHeader("x-late", "", "1", nil)}}))))
			}
			return out, nil
		}
		return nil, nil
	})
	c := newClient(t, conn, Config{ProcessingMode: mode(func(m *extprocfilterv3.ProcessingMode) {
		m.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
		m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
	})})
	ctx := testenv.Context(t)
	s := c.Open(ctx, nil)
	defer s.Close()
	if err := s.SendRequestHeaders(ctx, postRequest("abcd").Headers, false); err != nil {
		t.Fatal(err)
	}
	h, err := s.ReadUpstream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []struct {
		b   string
		eos bool
	}{{"ab", false}, {"cd", true}} {
		if err := s.SendRequestData(ctx, []byte(chunk.b), chunk.eos); err != nil {
			t.Fatal(err)
		}
	}
	up, err := collect(ctx, s.ReadUpstream)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]byte{[]byte("ab"), []byte("cd")}, up.Body); diff != "" {
		t.Errorf("upstream chunks (-want +got):\n%s", diff)
	}
	if _, ok := h.Headers.Get("x-late"); ok {
		t.Error("header_mutation from a STREAMED body reply was applied")
	}
	if len(held) != 2 {
		t.Errorf("server got %d body messages before answering, want 2 (pipelined)", len(held))
	}
}

// CONTINUE_AND_REPLACE replaces the body (here: adds one to a GET), drops
// content-length, and may change :method.
func TestContinueAndReplace(t *testing.T) {
	_, conn := startFake(t, onRequestHeaders(&extprocv3.CommonResponse{
		Status:         extprocv3.CommonResponse_CONTINUE_AND_REPLACE,
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":method", "", "POST", nil)}},
		BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("new")}},
	}))
	c := newClient(t, conn, Config{})
	res, err := c.Process(testenv.Context(t), getRequest())
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := res.Upstream.Headers.Get(":method"); m != "POST" || string(res.Upstream.BodyBytes()) != "new" {
		t.Errorf("got %s %q, want POST \"new\"", m, res.Upstream.BodyBytes())
	}
}

// Buffer limit: BUFFERED over the limit is 413 on the request path.
func TestBufferLimit(t *testing.T) {
	_, conn := startFake(t, passAll(nil))
	c := newClient(t, conn, Config{BufferLimit: 3, ProcessingMode: mode(func(m *extprocfilterv3.ProcessingMode) {
		m.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED
	})})
	res, err := c.Process(testenv.Context(t), postRequest("ab", "cd"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Info.LocalReply == nil || res.Info.LocalReply.Status != 413 {
		t.Errorf("got %+v, want 413", res.Info.LocalReply)
	}
}

// mode_override on a header reply changes the body mode when allowed.
func TestModeOverride(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(map[bool]string{false: "not allowed", true: "allowed"}[allow], func(t *testing.T) {
			pass := passAll(nil)
			f, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if req.GetRequestHeaders() != nil {
					r := reqHeadersResp(common())
					r.ModeOverride = &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}
					return one(r), nil
				}
				return pass(req)
			})
			c := newClient(t, conn, Config{AllowModeOverride: allow, ProcessingMode: mode(func(m *extprocfilterv3.ProcessingMode) {
				m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
			})})
			ctx := testenv.Context(t)
			s := c.Open(ctx, nil)
			defer s.Close()
			if err := s.SendRequestHeaders(ctx, postRequest("ab").Headers, false); err != nil {
				t.Fatal(err)
			}
			if !allow {
				// Headers are released once answered; the body then passes.
				if _, err := s.ReadUpstream(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.SendRequestData(ctx, []byte("ab"), true); err != nil {
				t.Fatal(err)
			}
			if _, err := collect(ctx, s.ReadUpstream); err != nil {
				t.Fatal(err)
			}
			want := []string{"request_headers"}
			if allow {
				want = append(want, "request_body:ab(eos)")
			}
			if diff := cmp.Diff(want, kinds(f.got())); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
		})
	}
}
