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
	bodyMode    extprocfilterv3.ProcessingMode_BodySendMode
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
	buf             []byte
	bufActive       bool
	bodySent        bool
	chunks          []Frame // STREAMED chunks awaiting their reply, FIFO
	trailers        Headers
	trailersHeld    bool
	fdsBodySent     bool
	fdsTrailersSent bool
	replaced        bool
	inputEnded      bool
	ended           bool
	localReplied    bool
}

func (s *side) setMode(m *extprocfilterv3.ProcessingMode) {
	if s.dir == dirRequest {
		s.headerMode, s.bodyMode, s.trailerMode = m.GetRequestHeaderMode(), m.GetRequestBodyMode(), m.GetRequestTrailerMode()
	} else {
		s.headerMode, s.bodyMode, s.trailerMode = m.GetResponseHeaderMode(), m.GetResponseBodyMode(), m.GetResponseTrailerMode()
	}
	if s.headerMode == extprocfilterv3.ProcessingMode_DEFAULT {
		s.headerMode = extprocfilterv3.ProcessingMode_SEND
	}
	if s.trailerMode == extprocfilterv3.ProcessingMode_DEFAULT {
		s.trailerMode = extprocfilterv3.ProcessingMode_SKIP
	}
}

// removeContentLength is ProcessorState::shouldRemoveContentLength.
func (s *side) removeContentLength() bool {
	switch s.bodyMode {
	case extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return true
	case extprocfilterv3.ProcessingMode_BUFFERED:
		return s.headerMode != extprocfilterv3.ProcessingMode_SEND
	}
	return false
}

func (s *side) fds() bool { return s.bodyMode == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED }

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
