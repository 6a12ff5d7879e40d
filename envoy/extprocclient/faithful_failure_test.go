package extprocclient

import (
	"context"
	"errors"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvgate/kvgate/internal/testenv"
)

// §6.5: no message timer in FULL_DUPLEX_STREAMED (the server may hold the
// header reply until it has read the whole body), and fail-open does not
// apply once body data went out in FULL_DUPLEX_STREAMED.
func TestFullDuplexNoTimerNoFailOpen(t *testing.T) {
	fdsReq := mode(func(m *extprocfilterv3.ProcessingMode) {
		m.RequestBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		m.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
		m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
	})
	t.Run("header reply held past message_timeout", func(t *testing.T) {
		var body []byte
		_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			b := req.GetRequestBody()
			if b == nil {
				return nil, nil
			}
			body = append(body, b.GetBody()...)
			if !b.GetEndOfStream() {
				return nil, nil
			}
			// Far past the 1 ms message timeout: a timer would have fired.
			<-time.After(50 * time.Millisecond)
			return []*extprocv3.ProcessingResponse{reqHeadersResp(common()), reqBodyResp(streamed(body, true))}, nil
		})
		c := newClient(t, conn, Config{ProcessingMode: fdsReq, MessageTimeout: time.Millisecond})
		res, err := c.Process(testenv.Context(t), postRequest("ab", "cd"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Info.LocalReply != nil {
			t.Fatalf("got local reply %+v, want none", res.Info.LocalReply)
		}
		if got := string(res.Upstream.BodyBytes()); got != "abcd" {
			t.Errorf("upstream body: got %q, want abcd", got)
		}
	})
	t.Run("fail-open stops once body sent", func(t *testing.T) {
		_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			if req.GetRequestBody() != nil {
				return nil, status.Error(codes.Internal, "boom")
			}
			return nil, nil
		})
		c := newClient(t, conn, Config{ProcessingMode: fdsReq, FailureModeAllow: true})
		res, err := c.Process(testenv.Context(t), postRequest("ab"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Info.LocalReply == nil || res.Info.LocalReply.Status != 500 {
			t.Fatalf("got local reply %+v, want 500", res.Info.LocalReply)
		}
	})
	t.Run("message timer runs outside FULL_DUPLEX_STREAMED", func(t *testing.T) {
		_, conn := startFake(t, func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) { return nil, nil })
		c := newClient(t, conn, Config{MessageTimeout: time.Millisecond})
		res, err := c.Process(testenv.Context(t), getRequest())
		if err != nil {
			t.Fatal(err)
		}
		want := &LocalReply{Status: 504, Details: "ext_proc_error_per-message_timeout_exceeded"}
		if diff := cmp.Diff(want, res.Info.LocalReply); diff != "" {
			t.Errorf("local reply (-want +got):\n%s", diff)
		}
	})
}

// §6.7: a clean OK close continues unmodified, even fail-closed; a gRPC
// error is status_on_error; a timeout is 504, not 500.
func TestCloseAndErrors(t *testing.T) {
	tests := []struct {
		name      string
		respond   respondFunc
		cfg       Config
		wantReply *LocalReply // nil: request continues
	}{
		{
			name:    "OK close before answering continues",
			respond: func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) { return nil, errCloseOK },
		},
		{
			name: "gRPC error fail-closed",
			respond: func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				return nil, status.Error(codes.Unavailable, "down")
			},
			wantReply: &LocalReply{Status: 500, Details: "ext_proc_error_gRPC_error_14{down}"},
		},
		{
			name: "gRPC error with status_on_error",
			respond: func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				return nil, status.Error(codes.Internal, "x")
			},
			cfg:       Config{StatusOnError: 503},
			wantReply: &LocalReply{Status: 503, Details: "ext_proc_error_gRPC_error_13{x}"},
		},
		{
			name: "gRPC error fail-open continues",
			respond: func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				return nil, status.Error(codes.Internal, "x")
			},
			cfg: Config{FailureModeAllow: true},
		},
		{
			name:      "message timeout fail-closed is 504",
			respond:   func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) { return nil, nil },
			cfg:       Config{MessageTimeout: time.Millisecond},
			wantReply: &LocalReply{Status: 504, Details: "ext_proc_error_per-message_timeout_exceeded"},
		},
		{
			name:    "message timeout fail-open continues",
			respond: func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) { return nil, nil },
			cfg:     Config{MessageTimeout: time.Millisecond, FailureModeAllow: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, conn := startFake(t, tt.respond)
			c := newClient(t, conn, tt.cfg)
			req := postRequest("abcd")
			req.Upstream = upstreamOK("ok")
			res, err := c.Process(testenv.Context(t), req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantReply, res.Info.LocalReply); diff != "" {
				t.Fatalf("local reply (-want +got):\n%s", diff)
			}
			if tt.wantReply != nil {
				if got, _ := res.Downstream.Headers.Get(":status"); got != itoa(tt.wantReply.Status) {
					t.Errorf("downstream :status: got %s, want %d", got, tt.wantReply.Status)
				}
				return
			}
			if got := string(res.Upstream.BodyBytes()); got != "abcd" {
				t.Errorf("upstream body: got %q, want unmodified abcd", got)
			}
			if got := string(res.Downstream.BodyBytes()); got != "ok" {
				t.Errorf("downstream body: got %q, want ok", got)
			}
		})
	}
}

// ImmediateResponse: a local reply on the request path (nothing goes
// upstream), on the response path before headers, and a reset after.
func TestImmediateResponse(t *testing.T) {
	ir := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("retry-after", "", "1", nil), setHeader("x-envoy-x", "", "no", nil)}},
		Body:    []byte(`{"error":{}}`),
		Details: "kvgate saturated",
	}}}
	t.Run("request path", func(t *testing.T) {
		_, conn := startFake(t, func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) { return one(ir), nil })
		c := newClient(t, conn, Config{})
		req := postRequest("ab")
		req.Upstream = func(context.Context, *Message) (*Message, error) {
			return nil, errors.New("upstream must not be called")
		}
		res, err := c.Process(testenv.Context(t), req)
		if err != nil {
			t.Fatal(err)
		}
		want := &Message{
			Headers: Headers{{":status", "429"}, {"retry-after", "1"}, {"content-type", "text/plain"}, {"content-length", "12"}},
			Body:    [][]byte{[]byte(`{"error":{}}`)},
		}
		if diff := cmp.Diff(want, res.Downstream); diff != "" {
			t.Errorf("downstream (-want +got):\n%s", diff)
		}
		if res.Upstream != nil {
			t.Errorf("upstream got %+v, want nothing", res.Upstream)
		}
		if got := res.Info.LocalReply.Details; got != "kvgate_saturated" {
			t.Errorf("details: got %q, want kvgate_saturated", got)
		}
	})
	t.Run("response body after headers went downstream resets", func(t *testing.T) {
		pass := passAll(fdsBoth)
		_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			if req.GetResponseBody() != nil {
				return one(ir), nil
			}
			return pass(req)
		})
		c := newClient(t, conn, Config{ProcessingMode: fdsBoth})
		req := getRequest()
		req.Upstream = upstreamOK("x")
		res, err := c.Process(testenv.Context(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Reset {
			t.Errorf("got no reset, downstream %+v", res.Downstream)
		}
	})
	t.Run("disable_immediate_response makes it spurious", func(t *testing.T) {
		_, conn := startFake(t, func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) { return one(ir), nil })
		c := newClient(t, conn, Config{DisableImmediateResponse: true})
		res, err := c.Process(testenv.Context(t), getRequest())
		if err != nil {
			t.Fatal(err)
		}
		if res.Info.LocalReply == nil || res.Info.LocalReply.Status != 500 || res.Info.SpuriousMessages != 1 {
			t.Errorf("got %+v spurious %d, want 500 spurious", res.Info.LocalReply, res.Info.SpuriousMessages)
		}
	})
}

// Spurious messages: fail-closed is status_on_error; fail-open ignores the
// server for the rest of the request.
func TestSpuriousMessages(t *testing.T) {
	fdsReq := mode(func(m *extprocfilterv3.ProcessingMode) {
		m.RequestBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		m.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
		m.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
	})
	tests := []struct {
		name     string
		mode     *extprocfilterv3.ProcessingMode
		reply    func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
		failOpen bool
		want     int // local reply status, 0 = continues
	}{
		{"wrong reply type", nil, func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse { return respHeadersResp(common()) }, false, 500},
		{"wrong reply type fail-open", nil, func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse { return respHeadersResp(common()) }, true, 0},
		{"empty response", nil, func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			return &extprocv3.ProcessingResponse{}
		}, false, 500},
		{"plain body in FULL_DUPLEX_STREAMED", fdsReq, func(r *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if r.GetRequestHeaders() != nil {
				return reqHeadersResp(common())
			}
			return reqBodyResp(&extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("x")}}})
		}, false, 500},
		{"streamed_response outside FULL_DUPLEX_STREAMED", mode(func(m *extprocfilterv3.ProcessingMode) {
			m.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED
		}), func(r *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if r.GetRequestHeaders() != nil {
				return reqHeadersResp(common())
			}
			return reqBodyResp(streamed([]byte("x"), true))
		}, false, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, conn := startFake(t, func(r *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				return one(tt.reply(r)), nil
			})
			c := newClient(t, conn, Config{ProcessingMode: tt.mode, FailureModeAllow: tt.failOpen})
			res, err := c.Process(testenv.Context(t), postRequest("ab"))
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			if res.Info.LocalReply != nil {
				got = res.Info.LocalReply.Status
			}
			if got != tt.want || res.Info.SpuriousMessages != 1 {
				t.Errorf("got status %d spurious %d, want %d spurious 1", got, res.Info.SpuriousMessages, tt.want)
			}
		})
	}
}

// override_message_timeout replaces the pending call's timer, within
// max_message_timeout; the rest of that message is ignored.
func TestOverrideMessageTimeout(t *testing.T) {
	_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() == nil {
			return nil, nil
		}
		// Shorten the hour-long timer to 1 ms; the header reply riding
		// along must be ignored, so the call times out.
		return []*extprocv3.ProcessingResponse{{
			OverrideMessageTimeout: durationpb.New(time.Millisecond),
			Response:               &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
		}}, nil
	})
	c := newClient(t, conn, Config{MessageTimeout: time.Hour, MaxMessageTimeout: time.Hour})
	res, err := c.Process(testenv.Context(t), getRequest())
	if err != nil {
		t.Fatal(err)
	}
	if res.Info.LocalReply == nil || res.Info.LocalReply.Status != 504 {
		t.Errorf("got %+v, want 504", res.Info.LocalReply)
	}
}

// An unreachable server is a gRPC error: status_on_error, or continue
// when fail-open.
func TestUnreachableServer(t *testing.T) {
	_, conn := startFake(t, passAll(nil))
	conn.Close()
	for _, failOpen := range []bool{false, true} {
		c := newClient(t, conn, Config{FailureModeAllow: failOpen})
		res, err := c.Process(testenv.Context(t), getRequest())
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Info.LocalReply != nil; got == failOpen {
			t.Errorf("fail-open %v: got local reply %+v", failOpen, res.Info.LocalReply)
		}
	}
}
