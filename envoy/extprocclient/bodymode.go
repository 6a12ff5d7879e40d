package extprocclient

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// bodyMode is what one body send mode changes in a direction's
// ProcessorState (processor_state.cc, and ext_proc.cc's onData and
// onTrailers): how body data and trailers are sent, what is held while a
// reply is awaited, and how a body reply is applied. Each mode is one
// implementation in its own file (bodymode_*.go) and one case in
// bodyModeOf; the Stream does nothing mode-specific besides calling these
// methods.
//
// Implementations hold no state: what a mode holds lives in the side (one
// field per mode), and every method runs on the Stream's loop goroutine.
type bodyMode interface {
	// removesContentLength is shouldRemoveContentLength for the
	// direction's header mode.
	removesContentLength(headerMode extprocfilterv3.ProcessingMode_HeaderSendMode) bool
	// admits reports whether input frame f may be processed while sd's
	// callback (not idle) is in flight, rather than held until the reply.
	admits(sd *side, f Frame) bool
	// runsTimer reports whether a message awaiting a reply starts the
	// message timer (headers and trailers included).
	runsTimer() bool
	// drained reports whether Envoy no longer has the original bytes of
	// sd's body, which ends fail-open (failureModeAllow).
	drained(sd *side) bool
	// holdsHeaders reports whether the headers, once answered, stay held
	// until the body's reply.
	holdsHeaders() bool
	// onData processes one body chunk (sd.replaced is false).
	onData(s *Stream, sd *side, f Frame)
	// onTrailers processes trailers (sd.trailers is set) and reports
	// whether it did; false leaves them to the mode-independent path (sent
	// if trailer mode SEND, else passed on).
	onTrailers(s *Stream, sd *side) bool
	// trailersPending reports whether a trailers reply is awaited besides
	// a trailers callback (cbTrailers).
	trailersPending(sd *side) bool
	// onBodyResponse applies a body reply, or returns a spuriousError.
	onBodyResponse(s *Stream, sd *side, c *extprocv3.CommonResponse) error
	// finish ends the direction, if the mode owes it, once processing has
	// stopped and what was held has been released (clearAsyncState).
	finish(s *Stream, sd *side)
}

// bodyModeOf is the implementation of m. BUFFERED_PARTIAL and GRPC, which
// Config.Validate refuses but a mode_override may still ask for, behave as
// NONE.
func bodyModeOf(m extprocfilterv3.ProcessingMode_BodySendMode) bodyMode {
	switch m {
	case extprocfilterv3.ProcessingMode_BUFFERED:
		return modeBuffered{}
	case extprocfilterv3.ProcessingMode_STREAMED:
		return modeStreamed{}
	case extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return modeFullDuplex{}
	default:
		return modeNone{}
	}
}

// bodyMutationKind says which body_mutation a reply carries: a
// streamed_response, or a plain one (body or clear_body).
func bodyMutationKind(c *extprocv3.CommonResponse) (streamedResponse, plain bool) {
	bm := c.GetBodyMutation()
	_, streamedResponse = bm.GetMutation().(*extprocv3.BodyMutation_StreamedResponse)
	return streamedResponse, bm.GetMutation() != nil && !streamedResponse
}

// spuriousBody is the error of a body reply the direction did not await.
func spuriousBody(sd *side) error {
	return spuriousError{"spurious message: unexpected " + sd.dir.String() + " body response"}
}

// mutatedBody applies a plain body_mutation to data.
func mutatedBody(c *extprocv3.CommonResponse, data []byte) []byte {
	switch m := c.GetBodyMutation().GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return m.Body
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			return nil
		}
	}
	return data
}
