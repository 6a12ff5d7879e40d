package extprocclient

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// The Gateway API Inference Extension's endpoint-picker protocol v1.0.0 as
// the data plane plays it (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol): the subset hint the
// gateway may send, the destination list it reads (Envoy's override_host
// load-balancing policy: envoy.lb metadata, then the header) and the
// served endpoint it reports on the response.
const (
	// LBNamespace is the dynamic metadata namespace of the destination
	// list and of the served report.
	LBNamespace = "envoy.lb"
	// DestinationKey is the header and the envoy.lb key of the destination
	// list: "ip:port" or "ip:port,ip:port,...", first first.
	DestinationKey = "x-gateway-destination-endpoint"
	// ServedKey is the envoy.lb key of the endpoint that served the request.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey carry the endpoints the picker must
	// choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
)

// SubsetHint returns the dynamic metadata another filter sets to name the
// endpoint subset (Request.Metadata, or Open's metadata): namespace
// envoy.lb.subset_hint, key x-gateway-destination-endpoint-subset, a list
// of strings. It reaches the server only when SubsetNamespace is one of
// Config.ForwardingNamespaces, as in Envoy.
func SubsetHint(endpoints ...string) map[string]*structpb.Struct {
	vals := make([]*structpb.Value, len(endpoints))
	for i, e := range endpoints {
		vals[i] = structpb.NewStringValue(e)
	}
	return map[string]*structpb.Struct{SubsetNamespace: {Fields: map[string]*structpb.Value{
		SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals}),
	}}}
}

// ErrDestinationMismatch: the server set different values in the
// x-gateway-destination-endpoint header and the envoy.lb metadata, which
// the protocol forbids (proxies read either, with no defined precedence).
var ErrDestinationMismatch = errors.New("x-gateway-destination-endpoint header and envoy.lb metadata differ")

// Destinations returns the endpoints the picker chose for a request, in
// order, as override_host reads them: the envoy.lb metadata list, else the
// header's (h: the request headers as they went upstream). Both set and
// different: the list is still returned, with ErrDestinationMismatch.
func Destinations(h Headers, info Info) ([]string, error) {
	hv, hasHeader := h.Get(DestinationKey)
	mv, hasMD := info.DynamicMetadata[LBNamespace].GetFields()[DestinationKey]
	header, md := splitList(hv), splitList(mv.GetStringValue())
	switch {
	case hasMD && hasHeader && strings.Join(md, ",") != strings.Join(header, ","):
		return md, fmt.Errorf("%w: header %q, metadata %q", ErrDestinationMismatch, hv, mv.GetStringValue())
	case hasMD && len(md) > 0:
		return md, nil
	}
	return header, nil
}

// ReportServed records, as the load balancer does once the upstream
// answered (override_host's selected_host_key), the endpoint that served
// the request: envoy.lb x-gateway-destination-endpoint-served. The response
// path's messages forward it when envoy.lb is a forwarding namespace.
func (s *Stream) ReportServed(endpoint string) {
	s.SetDynamicMetadata(LBNamespace, &structpb.Struct{Fields: map[string]*structpb.Value{
		ServedKey: structpb.NewStringValue(endpoint),
	}})
}

// ErrConnectFailure is what a Request.Endpoint function returns for an
// endpoint that cannot be reached: the next endpoint of the list is tried,
// as Envoy's retry on connect-failure does with override_host.
var ErrConnectFailure = errors.New("upstream connect failure")

// pickEndpoint plays override_host and the router's retries: it calls
// dial with each destination in order until one does not fail with
// ErrConnectFailure, and reports that one as served.
func pickEndpoint(ctx context.Context, s *Stream, up *Message, dial func(context.Context, string, *Message) (*Message, error)) (*Message, error) {
	eps, _ := Destinations(up.Headers, s.Info())
	if len(eps) == 0 {
		return nil, errors.New("no destination endpoint to send the request to")
	}
	var last error
	for _, ep := range eps {
		resp, err := dial(ctx, ep, up)
		if errors.Is(err, ErrConnectFailure) {
			last = err
			continue
		}
		if err != nil {
			return nil, err
		}
		s.ReportServed(ep)
		return resp, nil
	}
	return nil, fmt.Errorf("every destination failed: %w", last)
}

func splitList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
