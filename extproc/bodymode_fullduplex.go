package extproc

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// fullDuplex is FULL_DUPLEX_STREAMED: Envoy sends the headers, every body
// chunk at once without waiting for replies, then the trailers; it drains
// the original bytes, so only what the server streams back
// (streamed_response) reaches the peer. The server holds its header reply
// until the request body is complete (end_of_stream or the trailers), sends
// the routing headers in it, then re-emits the body as it came; other
// bodies are echoed chunk by chunk.
type fullDuplex struct{}

var _ routingMode = fullDuplex{}

func (fullDuplex) mode() extprocfilterv3.ProcessingMode_BodySendMode {
	return extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// requestHeaders holds the header reply: the routing headers go in it.
func (fullDuplex) requestHeaders(*exchange) error { return nil }

func (fullDuplex) bodyComplete(b *extprocv3.HttpBody) bool { return b.GetEndOfStream() }

// sendRoute answers the held headers, then re-emits the body as it came,
// splitting only chunks over MaxChunkBytes. The last chunk ends the stream
// unless trailers will.
func (fullDuplex) sendRoute(x *exchange, common *extprocv3.CommonResponse, md *structpb.Struct) error {
	if err := x.send(&extprocv3.ProcessingResponse{
		Response:        &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}},
		DynamicMetadata: md,
	}); err != nil {
		return err
	}
	for i, c := range x.chunks {
		for len(c) > 0 {
			part := c[:min(len(c), MaxChunkBytes)]
			c = c[len(part):]
			last := i == len(x.chunks)-1 && len(c) == 0
			if err := x.send(streamedBody(true, part, last && !x.trailers)); err != nil {
				return err
			}
		}
	}
	if len(x.chunks) == 0 && !x.trailers {
		return x.send(streamedBody(true, nil, true))
	}
	x.chunks = nil
	return nil
}

// pass echoes the bytes: Envoy drained them.
func (fullDuplex) pass(x *exchange, b *extprocv3.HttpBody, request bool) error {
	return x.send(streamedBody(request, b.GetBody(), b.GetEndOfStream()))
}

// streamedBody is a streamed_response body reply. Its seven messages
// and wrappers come from one allocation (streamedReply) instead of seven:
// it is built for every chunk of every body, a streamed response's every
// token among them (BENCHMARKS.md "ext_proc exchange CPU").
func streamedBody(request bool, b []byte, end bool) *extprocv3.ProcessingResponse {
	r := &streamedReply{}
	r.sb.Body, r.sb.EndOfStream = b, end
	r.sr.StreamedResponse = &r.sb
	r.bm.Mutation = &r.sr
	r.cr.BodyMutation = &r.bm
	r.br.Response = &r.cr
	if request {
		r.req.RequestBody = &r.br
		r.pr.Response = &r.req
	} else {
		r.resp.ResponseBody = &r.br
		r.pr.Response = &r.resp
	}
	return &r.pr
}

// streamedReply holds the messages of one streamedBody reply together.
type streamedReply struct {
	pr   extprocv3.ProcessingResponse
	req  extprocv3.ProcessingResponse_RequestBody
	resp extprocv3.ProcessingResponse_ResponseBody
	br   extprocv3.BodyResponse
	cr   extprocv3.CommonResponse
	bm   extprocv3.BodyMutation
	sr   extprocv3.BodyMutation_StreamedResponse
	sb   extprocv3.StreamedBodyResponse
}
