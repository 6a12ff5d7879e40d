package extprocclient

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// modeStreamed is STREAMED: one message per codec chunk, pipelined without
// waiting, one reply per chunk matched FIFO; a chunk is released only when
// its reply arrives (with its body_mutation applied; header_mutation is
// ignored, the headers are gone already).
type modeStreamed struct{}

// streamedState is what STREAMED holds of a direction.
type streamedState struct {
	chunks []Frame // chunks awaiting their reply, FIFO
}

// release passes on the chunks awaiting replies unmodified, when
// processing stops.
func (st *streamedState) release(s *Stream, sd *side) {
	for _, c := range st.chunks {
		s.emit(sd, c)
	}
	st.chunks = nil
}

func (modeStreamed) removesContentLength(extprocfilterv3.ProcessingMode_HeaderSendMode) bool {
	return true
}

// admits: further chunks go out while earlier ones await their replies.
func (modeStreamed) admits(sd *side, f Frame) bool {
	return sd.cb == cbStreamedBody && f.Kind == FrameData
}

func (modeStreamed) runsTimer() bool                { return true }
func (modeStreamed) drained(*side) bool             { return false }
func (modeStreamed) holdsHeaders() bool             { return false }
func (modeStreamed) onTrailers(*Stream, *side) bool { return false }
func (modeStreamed) trailersPending(*side) bool     { return false }
func (modeStreamed) finish(*Stream, *side)          {}

func (modeStreamed) onData(s *Stream, sd *side, f Frame) {
	sd.streamed.chunks = append(sd.streamed.chunks, f)
	sd.cb = cbStreamedBody
	s.startTimer(sd)
	s.sendBody(sd, f.Data, f.EndStream)
}

func (modeStreamed) onBodyResponse(s *Stream, sd *side, c *extprocv3.CommonResponse) error {
	st := &sd.streamed
	if isStreamed, _ := bodyMutationKind(c); len(st.chunks) == 0 || isStreamed {
		return spuriousBody(sd)
	}
	chunk := st.chunks[0]
	st.chunks = st.chunks[1:]
	s.clearRouteCache(sd, c)
	data := mutatedBody(c, chunk.Data)
	if len(st.chunks) == 0 {
		sd.stopTimer()
		sd.cb = cbIdle
	} else {
		s.startTimer(sd)
	}
	s.emit(sd, Frame{Kind: FrameData, Data: data, EndStream: chunk.EndStream})
	return nil
}
