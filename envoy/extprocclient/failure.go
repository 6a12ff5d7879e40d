package extprocclient

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"google.golang.org/grpc/status"
)

// failOpen is Envoy's failureModeAllow(): fail-open does not survive body
// data sent in FULL_DUPLEX_STREAMED, whose original bytes are gone.
func (s *Stream) failOpen() bool {
	if s.req.body.drained(s.req) || s.resp.body.drained(s.resp) {
		return false
	}
	return s.c.cfg.FailureModeAllow
}

func (s *Stream) onRecv(it recvItem) {
	if s.complete || s.grpcClosed && it.err != nil {
		return
	}
	if it.err != nil && s.ctx.Err() != nil {
		// The stream's own context ended (Close, or the caller's ctx):
		// the receive error is that cancellation, not the server's. The
		// loop's select may see it before ctx.Done(); the loop ends next.
		return
	}
	if it.err != nil {
		if errors.Is(it.err, io.EOF) {
			s.onGRPCClose()
			return
		}
		s.onGRPCError(it.err)
		return
	}
	s.onResponse(it.resp)
}

// onGRPCClose: a clean OK close ends processing silently and the request
// continues unmodified, even fail-closed.
func (s *Stream) onGRPCClose() {
	if s.complete {
		return
	}
	s.continueUnmodified()
}

func (s *Stream) onGRPCError(err error) {
	if s.complete {
		return
	}
	st := status.Convert(err)
	s.fail(fmt.Sprintf("ext_proc_error_gRPC_error_%d{%s}", int(st.Code()), st.Message()), s.c.cfg.statusOnError())
}

func (s *Stream) onMessageTimeout() {
	if s.complete {
		return
	}
	s.fail("ext_proc_error_per-message_timeout_exceeded", 504)
}

// fail is the one failure path (gRPC error, message timeout, spurious
// message): fail-open continues unmodified, fail-closed answers the
// request with a local reply of code and details.
func (s *Stream) fail(details string, code int) {
	if s.failOpen() {
		s.continueUnmodified()
		return
	}
	s.localReply(code, nil, nil, details)
}

// continueUnmodified ends processing: the gRPC stream is closed and what
// was held goes on unmodified, as does the rest of the request.
func (s *Stream) continueUnmodified() {
	s.complete = true
	s.closeGRPC()
	s.clearAsyncState()
}

// clearAsyncState releases everything held, unmodified, and lets the rest
// of the request pass through (processing is complete).
func (s *Stream) clearAsyncState() {
	for _, sd := range []*side{s.req, s.resp} {
		sd.stopTimer()
		sd.cb = cbIdle
		if sd.headersHeld {
			sd.headersHeld = false
			s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers, EndStream: sd.noBody})
		}
		sd.streamed.release(s, sd)
		sd.buffered.release(s, sd)
		if sd.trailersHeld {
			sd.trailersHeld = false
			s.emit(sd, Frame{Kind: FrameTrailers, Headers: sd.trailers})
		}
		sd.body.finish(s, sd)
		s.pump(sd)
	}
}

// localReply is Envoy's sendLocalReply: processing ends, nothing more goes
// upstream, and the client gets the reply — or a reset if the response
// headers already went downstream. Local replies are not sent to ext_proc.
func (s *Stream) localReply(code int, h Headers, body []byte, details string) {
	s.complete = true
	s.req.stopTimer()
	s.resp.stopTimer()
	s.closeGRPC()
	lr := &LocalReply{Status: code, Headers: h.Clone(), Body: slices.Clone(body), Details: details}
	s.updateInfo(func(i *Info) { i.LocalReply = lr })
	s.c.log.Debug("local reply", "status", code, "details", details)
	if !s.req.ended {
		s.req.ended = true
		s.req.out.close(ErrLocalReply)
	}
	s.req.pending = nil
	s.resp.pending = nil
	s.resp.localReplied = true
	if s.resp.ended {
		return
	}
	if s.resp.headersReleased {
		s.resp.ended = true
		s.resp.out.close(ErrReset)
		return
	}
	out := Headers{{":status", strconv.Itoa(code)}}
	out = append(out, h...)
	if len(body) > 0 {
		if _, ok := out.Get("content-type"); !ok {
			out.Set("content-type", "text/plain")
		}
	}
	out.Set("content-length", strconv.Itoa(len(body)))
	s.emit(s.resp, Frame{Kind: FrameHeaders, Headers: out, EndStream: len(body) == 0})
	if len(body) > 0 {
		s.emit(s.resp, Frame{Kind: FrameData, Data: slices.Clone(body), EndStream: true})
	}
}
