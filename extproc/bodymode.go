package extproc

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// bodyMode is how bodies travel between Envoy and the server in one of
// Envoy's body send modes, for either direction. Each mode is one
// implementation in its own file (bodymode_*.go) and one case in
// bodyModeOf; the exchange does nothing mode-specific besides calling
// these methods. Implementations hold no state (the exchange does: they
// are shared by every stream), send through x.send, and run on the
// stream's goroutine like the exchange.
type bodyMode interface {
	// mode is the Envoy body send mode implemented.
	mode() extprocfilterv3.ProcessingMode_BodySendMode
	// pass answers body message b of the request (request true) or of the
	// response without changing it: what Envoy must be told for the bytes
	// to reach the peer as they came.
	pass(x *exchange, b *extprocv3.HttpBody, request bool) error
}

// routingMode is a request bodyMode the server can route in: the body is
// read whole before the routing headers go out. A request body mode that
// is not one is refused (500, unsupported_processing_mode).
type routingMode interface {
	bodyMode
	// requestHeaders answers the headers of a request to route that has a
	// body: it sends the header reply now, or holds it until the body is
	// complete (sendRoute sends it then).
	requestHeaders(x *exchange) error
	// bodyComplete reports whether request body message b completes the
	// body (request trailers complete it in every mode).
	bodyComplete(b *extprocv3.HttpBody) bool
	// sendRoute sends the routing answer, common (the routing header
	// mutation and clear_route_cache) with the dynamic metadata md, and
	// then what Envoy is still owed of the body held in x.chunks.
	sendRoute(x *exchange, common *extprocv3.CommonResponse, md *structpb.Struct) error
}

// bodyModeOf is the implementation of mode m.
func bodyModeOf(m extprocfilterv3.ProcessingMode_BodySendMode) bodyMode {
	switch m {
	case extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return fullDuplex{}
	case extprocfilterv3.ProcessingMode_BUFFERED:
		return buffered{}
	case extprocfilterv3.ProcessingMode_STREAMED:
		return streamed{}
	default:
		// NONE sends no body; BUFFERED_PARTIAL and GRPC are answered like
		// STREAMED, without routing.
		return otherMode{m}
	}
}

// continueBody is the BodyResponse that leaves the body message as Envoy
// holds it (every mode but FULL_DUPLEX_STREAMED, where Envoy drained it).
func continueBody(request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}
