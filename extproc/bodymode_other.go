package extproc

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// otherMode is a body mode with no implementation of its own: bodies pass
// with CONTINUE and requests in it cannot be routed.
type otherMode struct {
	m extprocfilterv3.ProcessingMode_BodySendMode
}

func (o otherMode) mode() extprocfilterv3.ProcessingMode_BodySendMode { return o.m }

func (otherMode) pass(x *exchange, _ *extprocv3.HttpBody, request bool) error {
	return x.send(continueBody(request))
}
