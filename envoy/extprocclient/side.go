package extprocclient

import (
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// callbackState is ProcessorState's CallbackState: which reply the filter
// awaits in a direction.
type callbackState int

const (
	cbIdle callbackState = iota
	cbHeaders
	cbBufferedBody
	cbStreamedBody
	cbTrailers
)

// side is one direction's ProcessorState.
type side struct {
	dir         direction
	out         *queue[Frame]
	headerMode  extprocfilterv3.ProcessingMode_HeaderSendMode
	body        bodyMode // the body send mode's strategy
	trailerMode extprocfilterv3.ProcessingMode_HeaderSendMode

	pending []Frame // input not yet processed (held by a callback)
	cb      callbackState
	timer   *time.Timer
	timerOn bool
	// timeoutOverridden: override_message_timeout is honoured once per call.
	timeoutOverridden bool

	headers         Headers
	headersHeld     bool
	headersReleased bool
	noBody          bool
	trailers        Headers
	trailersHeld    bool
	replaced        bool
	inputEnded      bool
	ended           bool
	localReplied    bool

	// What each body mode holds (bodymode_*.go). Only the current mode's
	// is in use; all are kept so that a mode_override cannot lose what
	// an earlier mode held.
	buffered   bufferedState
	streamed   streamedState
	fullDuplex fullDuplexState
}

func (s *side) setMode(m *extprocfilterv3.ProcessingMode) {
	if s.dir == dirRequest {
		s.headerMode, s.body, s.trailerMode = m.GetRequestHeaderMode(), bodyModeOf(m.GetRequestBodyMode()), m.GetRequestTrailerMode()
	} else {
		s.headerMode, s.body, s.trailerMode = m.GetResponseHeaderMode(), bodyModeOf(m.GetResponseBodyMode()), m.GetResponseTrailerMode()
	}
	if s.headerMode == extprocfilterv3.ProcessingMode_DEFAULT {
		s.headerMode = extprocfilterv3.ProcessingMode_SEND
	}
	if s.trailerMode == extprocfilterv3.ProcessingMode_DEFAULT {
		s.trailerMode = extprocfilterv3.ProcessingMode_SKIP
	}
}

// removeContentLength is ProcessorState::shouldRemoveContentLength.
func (s *side) removeContentLength() bool { return s.body.removesContentLength(s.headerMode) }

func (s *side) timerC() <-chan time.Time {
	if !s.timerOn {
		return nil
	}
	return s.timer.C
}

func (s *side) stopTimer() {
	if s.timerOn {
		s.timer.Stop()
		s.timerOn = false
	}
}
