package extprocclient

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// modeFullDuplex is FULL_DUPLEX_STREAMED: headers, every chunk at once
// (without waiting for the header reply) and the trailers are sent as
// they come; the original bytes are drained, so only what the server
// streams back (streamed_response) reaches the peer, in any number of
// replies. No message timer runs in the direction, for its headers and
// trailers either (ProcessorState::onStartProcessorCall), and fail-open
// ends with the first body chunk sent (failureModeAllow).
type modeFullDuplex struct{}

// fullDuplexState is what FULL_DUPLEX_STREAMED records of a direction.
type fullDuplexState struct {
	bodySent     bool // a body chunk went out: its bytes are gone
	trailersSent bool
}

func (modeFullDuplex) removesContentLength(extprocfilterv3.ProcessingMode_HeaderSendMode) bool {
	return true
}

// admits: nothing waits for a reply.
func (modeFullDuplex) admits(*side, Frame) bool { return true }
func (modeFullDuplex) runsTimer() bool          { return false }
func (modeFullDuplex) drained(sd *side) bool    { return sd.fullDuplex.bodySent }
func (modeFullDuplex) holdsHeaders() bool       { return false }

func (modeFullDuplex) onData(s *Stream, sd *side, f Frame) {
	sd.fullDuplex.bodySent = true
	s.sendBody(sd, f.Data, f.EndStream)
}

func (modeFullDuplex) onTrailers(s *Stream, sd *side) bool {
	sd.fullDuplex.trailersSent = true
	s.sendTrailers(sd)
	return true
}

func (modeFullDuplex) trailersPending(sd *side) bool { return sd.fullDuplex.trailersSent }

// onBodyResponse: any number of streamed_response replies, after the
// headers reply and a body chunk; a plain body_mutation is spurious.
func (modeFullDuplex) onBodyResponse(s *Stream, sd *side, c *extprocv3.CommonResponse) error {
	if _, plain := bodyMutationKind(c); sd.cb == cbHeaders || !sd.fullDuplex.bodySent || plain {
		return spuriousBody(sd)
	}
	s.clearRouteCache(sd, c)
	if sr := c.GetBodyMutation().GetStreamedResponse(); sr != nil && !sd.replaced {
		s.emit(sd, Frame{Kind: FrameData, Data: sr.GetBody(), EndStream: sr.GetEndOfStream()})
	}
	return nil
}

// finish: the original body was drained, so a direction whose input has
// ended is ended with what is left (the trailers, or an empty last chunk).
func (modeFullDuplex) finish(s *Stream, sd *side) {
	if sd.ended || !sd.inputEnded || len(sd.pending) > 0 || !sd.headersReleased {
		return
	}
	if sd.fullDuplex.trailersSent {
		s.emit(sd, Frame{Kind: FrameTrailers, Headers: sd.trailers})
	} else {
		s.emit(sd, Frame{Kind: FrameData, EndStream: true})
	}
}
