package extproc

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// buffered is BUFFERED: Envoy holds the headers until they are answered,
// then sends the whole body in one message (end_of_stream false when
// trailers follow) and holds it, and the headers again, until the body is
// answered. The server answers the headers at once and puts the routing
// headers in the body reply, which Envoy applies while it still holds the
// headers.
type buffered struct{}

var _ routingMode = buffered{}

func (buffered) mode() extprocfilterv3.ProcessingMode_BodySendMode {
	return extprocfilterv3.ProcessingMode_BUFFERED
}

func (buffered) requestHeaders(x *exchange) error {
	return x.send(headersResponse(false, nil))
}

// bodyComplete: the one body message is the whole body.
func (buffered) bodyComplete(*extprocv3.HttpBody) bool { return true }

func (buffered) sendRoute(x *exchange, common *extprocv3.CommonResponse, md *structpb.Struct) error {
	return x.send(&extprocv3.ProcessingResponse{
		Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}},
		DynamicMetadata: md,
	})
}

func (buffered) pass(x *exchange, _ *extprocv3.HttpBody, request bool) error {
	return x.send(continueBody(request))
}
