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
//
// Items 1–4 and 9 are tested here, 6, 8 and 10 in faithful_body_test.go,
// 5 and 7 in faithful_failure_test.go.

import (
	"io"
	"testing"

	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
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
