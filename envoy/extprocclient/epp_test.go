package extprocclient

import (
	"context"
	"errors"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/internal/testenv"
)

// The data plane's side of the endpoint-picker protocol, against a fake
// picker at the one seam it replaces (the ext_proc server).

// pickerFake answers the request headers with the list in the header and
// the envoy.lb metadata (header and md may differ, to play a faulty
// picker) and passes everything else.
func pickerFake(header, md string) respondFunc {
	pass := passAll(nil)
	return func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() == nil {
			return pass(req)
		}
		r := reqHeadersResp(common(withMutation(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: DestinationKey, RawValue: []byte(header)}},
		}})))
		r.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{DestinationKey: structpb.NewStringValue(md)}}),
		}}
		return one(r), nil
	}
}

// The subset hint reaches the picker in metadata_context only when its
// namespace is forwarded, as Envoy's forwarding_namespaces do.
func TestSubsetHintForwarding(t *testing.T) {
	for _, tc := range []struct {
		name       string
		forwarding []string
		want       []string
	}{
		{"forwarded", []string{SubsetNamespace}, []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"not forwarded", []string{LBNamespace}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, conn := startFake(t, pickerFake("10.0.0.1:8000", "10.0.0.1:8000"))
			c := newClient(t, conn, Config{ForwardingNamespaces: tc.forwarding, ReceivingNamespaces: []string{LBNamespace}})
			req := postRequest()
			req.Metadata = SubsetHint("10.0.0.1:8000", "10.0.0.2:8000")
			if _, err := c.Process(testenv.Context(t), req); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range f.got()[0].GetMetadataContext().GetFilterMetadata()[SubsetNamespace].GetFields()[SubsetKey].GetListValue().GetValues() {
				got = append(got, v.GetStringValue())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("subset in metadata_context %v, want %v", got, tc.want)
			}
		})
	}
}

// Request.Endpoint goes down the list on connect failures and reports the
// endpoint that answered in the response messages' metadata_context.
func TestEndpointFallbackReportsServed(t *testing.T) {
	f, conn := startFake(t, pickerFake("10.0.0.1:8000,10.0.0.2:8000", "10.0.0.1:8000,10.0.0.2:8000"))
	c := newClient(t, conn, Config{ForwardingNamespaces: []string{LBNamespace}, ReceivingNamespaces: []string{LBNamespace}})
	var tried []string
	req := postRequest()
	req.Endpoint = func(ctx context.Context, ep string, _ *Message) (*Message, error) {
		tried = append(tried, ep)
		if ep == "10.0.0.1:8000" {
			return nil, ErrConnectFailure
		}
		return &Message{Headers: Headers{{":status", "200"}}}, nil
	}
	res, err := c.Process(testenv.Context(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tried, []string{"10.0.0.1:8000", "10.0.0.2:8000"}) {
		t.Errorf("tried %v, want the list in order", tried)
	}
	var served string
	for _, r := range f.got() {
		if r.GetResponseHeaders() != nil {
			served = r.GetMetadataContext().GetFilterMetadata()[LBNamespace].GetFields()[ServedKey].GetStringValue()
		}
	}
	if served != "10.0.0.2:8000" {
		t.Errorf("served in the response headers' metadata_context %q, want 10.0.0.2:8000", served)
	}
	if got := res.Info.DynamicMetadata[LBNamespace].GetFields()[ServedKey].GetStringValue(); got != "10.0.0.2:8000" {
		t.Errorf("served in the request's metadata %q", got)
	}
}

// Destinations reads the list as override_host does and flags a picker
// that sets different values in the header and the metadata.
func TestDestinations(t *testing.T) {
	for _, tc := range []struct {
		name, header, md string
		want             []string
		mismatch         bool
	}{
		{"identical", "10.0.0.1:8000,10.0.0.2:8000", "10.0.0.1:8000,10.0.0.2:8000", []string{"10.0.0.1:8000", "10.0.0.2:8000"}, false},
		{"different", "10.0.0.1:8000", "10.0.0.1:8000,10.0.0.2:8000", []string{"10.0.0.1:8000", "10.0.0.2:8000"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, conn := startFake(t, pickerFake(tc.header, tc.md))
			c := newClient(t, conn, Config{ReceivingNamespaces: []string{LBNamespace}})
			res, err := c.Process(testenv.Context(t), postRequest())
			if err != nil {
				t.Fatal(err)
			}
			got, err := Destinations(res.Upstream.Headers, res.Info)
			if errors.Is(err, ErrDestinationMismatch) != tc.mismatch {
				t.Errorf("error %v, want mismatch %v", err, tc.mismatch)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("destinations %v, want %v", got, tc.want)
			}
		})
	}
	// Metadata dropped (envoy.lb not a receiving namespace): the header.
	if got, err := Destinations(Headers{{DestinationKey, "10.0.0.3:1"}}, Info{}); err != nil || !slices.Equal(got, []string{"10.0.0.3:1"}) {
		t.Errorf("header only: %v %v", got, err)
	}
}
