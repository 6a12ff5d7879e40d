package extprocclient

// One test (or table) per thing a naive fake client gets wrong (§6.1–§6.10
// below, each with the Envoy source that shows it), then the rest of what
// the package doc says is reproduced. Sources are Envoy's
// source/extensions/filters/http/ext_proc/ unless said otherwise:
//
//  1. header values in raw_value both ways (mutation_utils.cc);
//  2. set_headers honours the legacy append only (mutation_utils.cc);
//  3. clear_route_cache only with a header_mutation, request path only
//     (processor_state.cc, clearRouteCache);
//  4. dynamic metadata only for receiving namespaces (ext_proc.cc,
//     setDynamicMetadata);
//  5. no message timer and no fail-open in FULL_DUPLEX_STREAMED
//     (processor_state.cc, onStartProcessorCall; ext_proc.cc,
//     failureModeAllow);
//  6. content-length removed, or checked in BUFFERED (processor_state.h,
//     shouldRemoveContentLength; processor_state.cc, validateContentLength);
//  7. a clean OK close is no error, a timeout is 504 (client_impl.cc,
//     onRemoteClose; ext_proc.cc, onMessageTimeout);
//  8. no body before the header reply (BUFFERED, STREAMED), no
//     end_of_stream on a BUFFERED body that has trailers (ext_proc.cc,
//     onData, onTrailers);
//  9. ':' headers and host not removable nor appendable, :path settable
//     (source/extensions/filters/common/mutation_rules/mutation_rules.cc);
//  10. header_mutation ignored in STREAMED body replies (processor_state.cc,
//     handleStreamedBodyResponse).

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvgate/kvgate/internal/testenv"
)

func setHeader(key, value, raw string, app *bool) *corev3.HeaderValueOption {
	o := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, Value: value, RawValue: []byte(raw)}}
	if app != nil {
		//lint:ignore SA1019 the legacy append is what Envoy honours (§6.2).
		o.Append = wrapperspb.Bool(*app)
	}
	return o
}

func ptr[T any](v T) *T { return &v }

// onRequestHeaders answers request headers with c and everything else with
// a no-op.
func onRequestHeaders(c *extprocv3.CommonResponse) respondFunc {
	pass := passAll(nil)
	return func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil {
			return one(reqHeadersResp(c)), nil
		}
		return pass(req)
	}
}

// §6.1: Envoy sends header values in raw_value and reads them from
// raw_value only.
func TestRawValueBothWays(t *testing.T) {
	tests := []struct {
		name       string
		set        *corev3.HeaderValueOption
		wantHeader string
		wantStatus int // local reply status, 0 for none
	}{
		{"raw_value is applied", setHeader("x-gateway-destination-endpoint", "", "10.0.0.1:8000", nil), "10.0.0.1:8000", 0},
		{"value alone gives an empty header", setHeader("x-gateway-destination-endpoint", "10.0.0.1:8000", "", nil), "", 0},
		{"value and raw_value is an error", setHeader("x-gateway-destination-endpoint", "a", "b", nil), "", 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, conn := startFake(t, onRequestHeaders(common(withMutation(&extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{tt.set}}))))
			c := newClient(t, conn, Config{})
			res, err := c.Process(testenv.Context(t), getRequest())
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range f.got()[0].GetRequestHeaders().GetHeaders().GetHeaders() {
				if h.GetValue() != "" || (len(h.GetRawValue()) == 0 && h.GetKey() != "") {
					t.Errorf("sent header %q: value %q raw_value %q, want raw_value only", h.GetKey(), h.GetValue(), h.GetRawValue())
				}
			}
			if tt.wantStatus != 0 {
				if res.Info.LocalReply == nil || res.Info.LocalReply.Status != tt.wantStatus {
					t.Fatalf("got local reply %+v, want status %d", res.Info.LocalReply, tt.wantStatus)
				}
				return
			}
			got, ok := res.Upstream.Headers.Get("x-gateway-destination-endpoint")
			if !ok || got != tt.wantHeader {
				t.Errorf("upstream header: got %q (present %v), want %q", got, ok, tt.wantHeader)
			}
		})
	}
}

// §6.2: only the legacy append BoolValue counts; unset means overwrite;
// append_action is ignored.
func TestAppendSemantics(t *testing.T) {
	withAction := func(o *corev3.HeaderValueOption, a corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		o.AppendAction = a
		return o
	}
	tests := []struct {
		name string
		set  *corev3.HeaderValueOption
		want []string
	}{
		{"append unset overwrites", setHeader("x-tag", "", "new", nil), []string{"new"}},
		{"append false overwrites", setHeader("x-tag", "", "new", ptr(false)), []string{"new"}},
		{"append true adds", setHeader("x-tag", "", "new", ptr(true)), []string{"old", "new"}},
		{"append_action ADD_IF_ABSENT ignored", withAction(setHeader("x-tag", "", "new", nil), corev3.HeaderValueOption_ADD_IF_ABSENT), []string{"new"}},
		{"append_action APPEND_IF_EXISTS_OR_ADD ignored", withAction(setHeader("x-tag", "", "new", nil), corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD), []string{"new"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, conn := startFake(t, onRequestHeaders(common(withMutation(&extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{tt.set}}))))
			c := newClient(t, conn, Config{})
			req := getRequest()
			req.Headers.Add("x-tag", "old")
			res, err := c.Process(testenv.Context(t), req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, res.Upstream.Headers.Values("x-tag")); diff != "" {
				t.Errorf("x-tag (-want +got):\n%s", diff)
			}
		})
	}
}

// §6.3: clear_route_cache only on the request path and only with a header
// mutation in the same response.
func TestClearRouteCache(t *testing.T) {
	mut := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-a", "", "1", nil)}}
	tests := []struct {
		name        string
		request     *extprocv3.CommonResponse
		response    *extprocv3.CommonResponse
		disable     bool
		wantCleared bool
		wantIgnored int
	}{
		{"request with header mutation", &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: mut}, nil, false, true, 0},
		{"request without header mutation", &extprocv3.CommonResponse{ClearRouteCache: true}, nil, false, false, 1},
		{"response path", nil, &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: mut}, false, false, 1},
		{"disable_clear_route_cache", &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: mut}, nil, true, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pass := passAll(nil)
			_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				switch {
				case req.GetRequestHeaders() != nil && tt.request != nil:
					return one(reqHeadersResp(tt.request)), nil
				case req.GetResponseHeaders() != nil && tt.response != nil:
					return one(respHeadersResp(tt.response)), nil
				}
				return pass(req)
			})
			c := newClient(t, conn, Config{DisableClearRouteCache: tt.disable})
			req := getRequest()
			req.Upstream = upstreamOK("x")
			res, err := c.Process(testenv.Context(t), req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Info.RouteCacheCleared != tt.wantCleared || res.Info.ClearRouteCacheIgnored != tt.wantIgnored {
				t.Errorf("got cleared %v ignored %d, want %v %d", res.Info.RouteCacheCleared, res.Info.ClearRouteCacheIgnored, tt.wantCleared, tt.wantIgnored)
			}
		})
	}
}

// §6.4: dynamic metadata only into receiving namespaces.
func TestDynamicMetadataReceivingNamespaces(t *testing.T) {
	dm, err := structpb.NewStruct(map[string]any{
		"envoy.lb":     map[string]any{"x-gateway-destination-endpoint": "10.0.0.1:8000"},
		"other.filter": map[string]any{"k": "v"},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		receiving   []string
		wantLB      bool
		wantIgnored int
	}{
		{"default drops all", nil, false, 2},
		{"envoy.lb received, others dropped", []string{"envoy.lb"}, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pass := passAll(nil)
			_, conn := startFake(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if req.GetRequestHeaders() != nil {
					r := reqHeadersResp(common())
					r.DynamicMetadata = dm
					return one(r), nil
				}
				return pass(req)
			})
			c := newClient(t, conn, Config{ReceivingNamespaces: tt.receiving})
			res, err := c.Process(testenv.Context(t), getRequest())
			if err != nil {
				t.Fatal(err)
			}
			got := res.Info.DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			if (got != "") != tt.wantLB {
				t.Errorf("envoy.lb endpoint: got %q, want present %v", got, tt.wantLB)
			}
			if _, ok := res.Info.DynamicMetadata["other.filter"]; ok {
				t.Error("other.filter metadata accepted, want dropped")
			}
			if res.Info.MetadataNamespacesIgnored != tt.wantIgnored {
				t.Errorf("ignored namespaces: got %d, want %d", res.Info.MetadataNamespacesIgnored, tt.wantIgnored)
			}
		})
	}
}

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

// §6.9: mutation rules: no removing ':' headers or host, no appending to ':'
// headers, no setting host/:authority/:method/:scheme/x-envoy-*; :path ok.
func TestMutationRules(t *testing.T) {
	tests := []struct {
		name         string
		rules        *mutationrulesv3.HeaderMutationRules
		mut          *extprocv3.HeaderMutation
		wantPath     string
		wantAuth     string
		wantRejected int
		wantStatus   int
	}{
		{"set :path allowed", nil, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":path", "", "/v2", nil)}}, "/v2", "kvgate", 0, 0},
		{"remove :path refused", nil, &extprocv3.HeaderMutation{RemoveHeaders: []string{":path"}}, "/v1/models", "kvgate", 1, 0},
		{"remove host refused", nil, &extprocv3.HeaderMutation{RemoveHeaders: []string{"host"}}, "/v1/models", "kvgate", 1, 0},
		{"append to :path refused", nil, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":path", "", "/x", ptr(true))}}, "/v1/models", "kvgate", 1, 0},
		{"set :authority refused", nil, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":authority", "", "evil", nil)}}, "/v1/models", "kvgate", 1, 0},
		{"set host, :method, :scheme, x-envoy-* refused", nil, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			setHeader("host", "", "evil", nil), setHeader(":method", "", "PUT", nil), setHeader(":scheme", "", "https", nil), setHeader("x-envoy-retry-on", "", "5xx", nil),
		}}, "/v1/models", "kvgate", 4, 0},
		{"allow_all_routing permits :authority", &mutationrulesv3.HeaderMutationRules{AllowAllRouting: wrapperspb.Bool(true)},
			&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":authority", "", "other", nil)}}, "/v1/models", "other", 0, 0},
		{"disallow_is_error makes a refusal 500", &mutationrulesv3.HeaderMutationRules{DisallowIsError: wrapperspb.Bool(true)},
			&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":authority", "", "evil", nil)}}, "", "", 0, 500},
		{"invalid value is 500", nil, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-a", "", "a\r\nb", nil)}}, "", "", 0, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, conn := startFake(t, onRequestHeaders(common(withMutation(tt.mut))))
			c := newClient(t, conn, Config{MutationRules: tt.rules})
			res, err := c.Process(testenv.Context(t), getRequest())
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantStatus != 0 {
				if res.Info.LocalReply == nil || res.Info.LocalReply.Status != tt.wantStatus {
					t.Fatalf("got local reply %+v, want %d", res.Info.LocalReply, tt.wantStatus)
				}
				return
			}
			path, _ := res.Upstream.Headers.Get(":path")
			auth, _ := res.Upstream.Headers.Get(":authority")
			if path != tt.wantPath || auth != tt.wantAuth {
				t.Errorf("got :path %q :authority %q, want %q %q", path, auth, tt.wantPath, tt.wantAuth)
			}
			if res.Info.RejectedMutations != tt.wantRejected {
				t.Errorf("rejected mutations: got %d, want %d", res.Info.RejectedMutations, tt.wantRejected)
			}
		})
	}
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

var _ = io.EOF

// FuzzHeaderMutation applies arbitrary server mutations: never a panic, and
// whatever is accepted leaves a header map Envoy would accept.
func FuzzHeaderMutation(f *testing.F) {
	seed, _ := proto.Marshal(&extprocv3.HeaderMutation{
		SetHeaders:    []*corev3.HeaderValueOption{setHeader(":path", "", "/x", nil), setHeader("x-a", "", "1", ptr(true))},
		RemoveHeaders: []string{"host", "x-b"},
	})
	f.Add(seed, false)
	f.Add([]byte{0x0a, 0x03, 0x0a, 0x01, 0x3a}, true)
	f.Fuzz(func(t *testing.T, data []byte, disallowIsError bool) {
		m := &extprocv3.HeaderMutation{}
		if proto.Unmarshal(data, m) != nil {
			return
		}
		ch, err := newChecker(&mutationrulesv3.HeaderMutationRules{DisallowIsError: wrapperspb.Bool(disallowIsError)})
		if err != nil {
			t.Fatal(err)
		}
		h := Headers{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {":scheme", "http"}, {"host", "a"}}
		if _, err := ch.applyHeaderMutation(&h, m, mutateOptions{}); err != nil {
			return
		}
		for _, k := range []string{":method", ":authority", ":scheme", "host"} {
			if v := h.Values(k); len(v) != 1 {
				t.Fatalf("%s: got %q, want it untouched", k, v)
			}
		}
		for _, fld := range h {
			if !validHeaderName(fld.Key) || !validHeaderValue(fld.Value) {
				t.Fatalf("invalid header accepted: %q: %q", fld.Key, fld.Value)
			}
		}
	})
}
