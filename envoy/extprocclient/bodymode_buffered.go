package extprocclient

import (
	"fmt"
	"strconv"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// modeBuffered is BUFFERED: the whole body is buffered (413 request / 500
// response over the buffer limit) and sent in one message with
// end_of_stream, or without it when trailers arrive, which then follow its
// reply; the headers stay held until that reply, whose header_mutation
// applies to them.
type modeBuffered struct{}

// bufferedState is what BUFFERED holds of a direction.
type bufferedState struct {
	buf    []byte
	active bool // buffering has begun
	sent   bool // the body message went out
}

// release passes on the buffered body unmodified, when processing stops.
func (b *bufferedState) release(s *Stream, sd *side) {
	if b.active {
		s.emit(sd, Frame{Kind: FrameData, Data: b.buf, EndStream: b.sent && !sd.trailersHeld})
		b.buf, b.active = nil, false
	}
}

// removesContentLength: only with headers SKIP; with SEND the length is
// checked against the mutated body instead (validateContentLength).
func (modeBuffered) removesContentLength(h extprocfilterv3.ProcessingMode_HeaderSendMode) bool {
	return h != extprocfilterv3.ProcessingMode_SEND
}

func (modeBuffered) admits(*side, Frame) bool { return false }
func (modeBuffered) runsTimer() bool          { return true }
func (modeBuffered) drained(*side) bool       { return false }
func (modeBuffered) holdsHeaders() bool       { return true }
func (modeBuffered) trailersPending(*side) bool {
	return false
}
func (modeBuffered) finish(*Stream, *side) {}

func (modeBuffered) onData(s *Stream, sd *side, f Frame) {
	b := &sd.buffered
	b.buf = append(b.buf, f.Data...)
	b.active = true
	if len(b.buf) > s.c.cfg.bufferLimit() {
		if sd.dir == dirRequest {
			s.localReply(413, nil, []byte("Payload Too Large"), "request_payload_too_large")
		} else {
			s.localReply(500, nil, []byte("Internal Server Error"), "response_payload_too_large")
		}
		return
	}
	if f.EndStream {
		b.sent, sd.cb = true, cbBufferedBody
		s.startTimer(sd)
		s.sendBody(sd, b.buf, true)
	}
}

// onTrailers: the buffered body goes out when trailers arrive, without
// end_of_stream; the trailers follow its reply.
func (modeBuffered) onTrailers(s *Stream, sd *side) bool {
	b := &sd.buffered
	if !b.active || b.sent {
		return false
	}
	b.sent, sd.cb, sd.trailersHeld = true, cbBufferedBody, true
	s.startTimer(sd)
	s.sendBody(sd, b.buf, false)
	return true
}

func (modeBuffered) onBodyResponse(s *Stream, sd *side, c *extprocv3.CommonResponse) error {
	if isStreamed, _ := bodyMutationKind(c); sd.cb != cbBufferedBody || isStreamed {
		return spuriousBody(sd)
	}
	b := &sd.buffered
	sd.stopTimer()
	sd.cb = cbIdle
	if sd.headersHeld {
		// header_mutation applies only while the headers are held.
		if err := s.mutate(sd, &sd.headers, c.GetHeaderMutation(), mutateOptions{skipContentLength: sd.removeContentLength()}); err != nil {
			return err
		}
	}
	s.clearRouteCache(sd, c)
	b.buf = mutatedBody(c, b.buf)
	if sd.headersHeld && sd.headerMode == extprocfilterv3.ProcessingMode_SEND {
		if cl, ok := sd.headers.Get("content-length"); ok && cl != strconv.Itoa(len(b.buf)) {
			return fmt.Errorf("%w: mismatch between content-length %s and the length of the mutated body %d", errMutation, cl, len(b.buf))
		}
	}
	if sd.headersHeld {
		sd.headersHeld = false
		s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers})
	}
	s.emit(sd, Frame{Kind: FrameData, Data: b.buf, EndStream: !sd.trailersHeld})
	b.buf, b.active = nil, false
	if sd.trailersHeld {
		if sd.trailerMode == extprocfilterv3.ProcessingMode_SEND {
			sd.cb = cbTrailers
			s.startTimer(sd)
			s.sendTrailers(sd)
			return nil
		}
		sd.trailersHeld = false
		s.emit(sd, Frame{Kind: FrameTrailers, Headers: sd.trailers})
	}
	return nil
}
