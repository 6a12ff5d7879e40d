package extproc

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// streamed is STREAMED: Envoy sends each chunk as it comes and waits for
// one reply per chunk before releasing it. The server answers each with
// CONTINUE (the response's chunks are read for their usage on the way).
// A request body is not held whole in this mode, so it cannot be routed:
// streamed is not a routingMode.
type streamed struct{}

func (streamed) mode() extprocfilterv3.ProcessingMode_BodySendMode {
	return extprocfilterv3.ProcessingMode_STREAMED
}

func (streamed) pass(x *exchange, _ *extprocv3.HttpBody, request bool) error {
	return x.send(continueBody(request))
}
