package extprocclient

import (
	"context"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

type inputEvent struct {
	dir   direction
	frame Frame
}

type recvItem struct {
	resp *extprocv3.ProcessingResponse
	err  error
}

// Stream is one HTTP request passing through the filter: the caller feeds
// the request (Send*Request*) and, once it has an upstream response, the
// response (Send*Response*), and reads what the filter lets through towards
// the upstream (ReadUpstream) and towards the client (ReadDownstream). The
// gRPC stream is opened lazily, when the first message must go out.
//
// Each method is safe for concurrent use; the request side's Send calls must
// come in HTTP order (headers, data, trailers) from one goroutine, and so must
// the response side's. Send calls do not wait for the server: outputs are
// queued without bound (no flow control). Close must be called when done.
type Stream struct {
	c *Client
	// ctx is the stream's own lifetime, not a caller's request context:
	// the Stream IS one filter stream, as a grpc.ClientStream is (whose
	// Context() is the accepted exception to "no ctx in a struct"). Open
	// derives it, Close cancels it, and the loop goroutine, the lazily
	// opened gRPC stream and its receiver all live inside it; the Send and
	// Read calls take their own ctx for their own wait.
	ctx    context.Context
	cancel context.CancelFunc
	in     chan inputEvent
	msgs   *queue[recvItem]
	done   chan struct{}
	wg     sync.WaitGroup

	infoMu sync.Mutex
	info   Info

	// Owned by the loop goroutine.
	grpc       extprocv3.ExternalProcessor_ProcessClient
	grpcCancel context.CancelFunc
	opened     bool
	grpcClosed bool
	complete   bool // Envoy's processing_complete_
	req, resp  *side
}

// Open starts a Stream for one HTTP request. metadata is the dynamic
// metadata present before the filter (may be nil). It does not block and
// sends nothing yet. ctx bounds the whole exchange.
func (c *Client) Open(ctx context.Context, metadata map[string]*structpb.Struct) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	s := &Stream{
		c:      c,
		ctx:    ctx,
		cancel: cancel,
		in:     make(chan inputEvent),
		msgs:   newQueue[recvItem](),
		done:   make(chan struct{}),
	}
	s.info.DynamicMetadata = map[string]*structpb.Struct{}
	for ns, st := range metadata {
		s.info.DynamicMetadata[ns] = proto.Clone(st).(*structpb.Struct)
	}
	mode := c.cfg.mode()
	s.req = &side{dir: dirRequest, out: newQueue[Frame](), timer: stoppedTimer()}
	s.resp = &side{dir: dirResponse, out: newQueue[Frame](), timer: stoppedTimer()}
	s.req.setMode(mode)
	s.resp.setMode(mode)
	go s.loop()
	return s
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// SendRequestHeaders feeds the request headers (pseudo-headers included);
// endStream means the request has no body and no trailers.
func (s *Stream) SendRequestHeaders(ctx context.Context, h Headers, endStream bool) error {
	return s.input(ctx, dirRequest, Frame{Kind: FrameHeaders, Headers: h.Clone(), EndStream: endStream})
}

// SendRequestData feeds one request body chunk as the codec delivered it.
func (s *Stream) SendRequestData(ctx context.Context, b []byte, endStream bool) error {
	return s.input(ctx, dirRequest, Frame{Kind: FrameData, Data: slices.Clone(b), EndStream: endStream})
}

// SendRequestTrailers feeds the request trailers, which end the request.
func (s *Stream) SendRequestTrailers(ctx context.Context, t Headers) error {
	return s.input(ctx, dirRequest, Frame{Kind: FrameTrailers, Headers: t.Clone()})
}

// SendResponseHeaders feeds the upstream's response headers (with :status).
func (s *Stream) SendResponseHeaders(ctx context.Context, h Headers, endStream bool) error {
	return s.input(ctx, dirResponse, Frame{Kind: FrameHeaders, Headers: h.Clone(), EndStream: endStream})
}

// SendResponseData feeds one response body chunk.
func (s *Stream) SendResponseData(ctx context.Context, b []byte, endStream bool) error {
	return s.input(ctx, dirResponse, Frame{Kind: FrameData, Data: slices.Clone(b), EndStream: endStream})
}

// SendResponseTrailers feeds the response trailers.
func (s *Stream) SendResponseTrailers(ctx context.Context, t Headers) error {
	return s.input(ctx, dirResponse, Frame{Kind: FrameTrailers, Headers: t.Clone()})
}

func (s *Stream) input(ctx context.Context, d direction, f Frame) error {
	select {
	case s.in <- inputEvent{d, f}:
		return nil
	case <-s.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ReadUpstream blocks for the next frame the filter lets through towards
// the upstream. It returns io.EOF after the last frame, ErrLocalReply if
// the filter answered the request itself, ErrClosed once closed.
func (s *Stream) ReadUpstream(ctx context.Context) (Frame, error) { return s.req.out.pop(ctx) }

// ReadDownstream blocks for the next frame towards the client: the
// response after the response path, or the local reply. It returns io.EOF
// after the last frame, ErrReset if Envoy would reset the client's stream,
// ErrClosed once closed.
func (s *Stream) ReadDownstream(ctx context.Context) (Frame, error) { return s.resp.out.pop(ctx) }

// Info returns a snapshot of what the filter recorded so far.
func (s *Stream) Info() Info {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	out := s.info
	out.DynamicMetadata = maps.Clone(s.info.DynamicMetadata)
	if s.info.LocalReply != nil {
		lr := *s.info.LocalReply
		out.LocalReply = &lr
	}
	return out
}

func (s *Stream) updateInfo(f func(*Info)) {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	f(&s.info)
}

// SetDynamicMetadata merges fields into the request's dynamic metadata
// namespace ns, as another Envoy filter or the load balancer would (e.g.
// envoy.lb x-gateway-destination-endpoint-served once the upstream is
// known). Later messages forward it if ns is a forwarding namespace. It is
// safe for concurrent use.
func (s *Stream) SetDynamicMetadata(ns string, fields *structpb.Struct) {
	s.updateInfo(func(i *Info) {
		cur := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		if old, ok := i.DynamicMetadata[ns]; ok {
			cur = proto.Clone(old).(*structpb.Struct)
		}
		for k, v := range fields.GetFields() {
			cur.Fields[k] = proto.Clone(v).(*structpb.Value)
		}
		i.DynamicMetadata[ns] = cur
	})
}

// Close ends the exchange: the gRPC stream is half-closed and reset (the
// server sees CANCELLED, as with Envoy), readers get ErrClosed once drained.
// It waits for the Stream's goroutines and is idempotent.
func (s *Stream) Close() {
	s.cancel()
	<-s.done
	s.wg.Wait()
}

func (s *Stream) loop() {
	defer close(s.done)
	defer func() {
		s.closeGRPC()
		s.req.stopTimer()
		s.resp.stopTimer()
		s.req.out.close(ErrClosed)
		s.resp.out.close(ErrClosed)
	}()
	for {
		select {
		case <-s.ctx.Done():
			return
		case ev := <-s.in:
			s.onInput(ev)
		case <-s.msgs.ready:
			for {
				it, ok := s.msgs.tryPop()
				if !ok {
					break
				}
				s.onRecv(it)
			}
		case <-s.req.timerC():
			s.req.timerOn = false
			s.onMessageTimeout()
		case <-s.resp.timerC():
			s.resp.timerOn = false
			s.onMessageTimeout()
		}
	}
}

func (s *Stream) side(d direction) *side {
	if d == dirRequest {
		return s.req
	}
	return s.resp
}

func (s *Stream) onInput(ev inputEvent) {
	sd := s.side(ev.dir)
	if sd.inputEnded || sd.ended || sd.localReplied {
		return // after a local reply, or input past its end: dropped
	}
	if ev.frame.EndStream || ev.frame.Kind == FrameTrailers {
		sd.inputEnded = true
	}
	sd.pending = append(sd.pending, ev.frame)
	s.pump(sd)
}

// canProcess reports whether the next input frame may be handled now, or
// must wait for the callback in flight (Envoy's StopIteration + buffering).
func (s *Stream) canProcess(sd *side, f Frame) bool {
	if s.complete || sd.cb == cbIdle {
		return true
	}
	return sd.body.admits(sd, f)
}

func (s *Stream) pump(sd *side) {
	for len(sd.pending) > 0 && !sd.ended {
		f := sd.pending[0]
		if !s.canProcess(sd, f) {
			return
		}
		sd.pending = sd.pending[1:]
		// Data held while a callback was in flight reaches the filter as one
		// buffer, as the connection manager's buffering does.
		for f.Kind == FrameData && !f.EndStream && len(sd.pending) > 0 && sd.pending[0].Kind == FrameData {
			f.Data = append(f.Data, sd.pending[0].Data...)
			f.EndStream = sd.pending[0].EndStream
			sd.pending = sd.pending[1:]
		}
		if s.complete {
			s.passThrough(sd, f)
		} else {
			s.process(sd, f)
		}
	}
}

func (s *Stream) passThrough(sd *side, f Frame) {
	if f.Kind != FrameHeaders && sd.replaced {
		return
	}
	s.emit(sd, f)
}

func (s *Stream) emit(sd *side, f Frame) {
	if sd.ended {
		return
	}
	if f.Kind == FrameHeaders {
		sd.headersReleased = true
	}
	sd.out.push(f)
	if f.EndStream || f.Kind == FrameTrailers {
		sd.ended = true
		sd.out.close(io.EOF)
		s.maybeFinish()
	}
}

// maybeFinish closes the gRPC stream once both directions have ended.
func (s *Stream) maybeFinish() {
	if s.req.ended && s.resp.ended {
		s.complete = true
		s.req.stopTimer()
		s.resp.stopTimer()
		s.closeGRPC()
	}
}

func (s *Stream) process(sd *side, f Frame) {
	switch f.Kind {
	case FrameHeaders:
		sd.noBody = f.EndStream
		h := f.Headers
		if !f.EndStream && sd.removeContentLength() {
			h.Del("content-length")
		}
		if sd.headerMode != extprocfilterv3.ProcessingMode_SEND {
			s.emit(sd, Frame{Kind: FrameHeaders, Headers: h, EndStream: f.EndStream})
			return
		}
		sd.headers, sd.headersHeld, sd.cb = h, true, cbHeaders
		s.startTimer(sd)
		msg := &extprocv3.HttpHeaders{Headers: h.toProto(), EndOfStream: f.EndStream}
		if sd.dir == dirRequest {
			s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: msg}})
		} else {
			s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: msg}})
		}
	case FrameData:
		if sd.replaced {
			return
		}
		sd.body.onData(s, sd, f)
	case FrameTrailers:
		sd.trailers = f.Headers
		if sd.body.onTrailers(s, sd) {
			return
		}
		if sd.headersHeld {
			// BUFFERED headers waiting for a body that never came.
			sd.headersHeld = false
			s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers})
		}
		if sd.trailerMode == extprocfilterv3.ProcessingMode_SEND {
			sd.cb, sd.trailersHeld = cbTrailers, true
			s.startTimer(sd)
			s.sendTrailers(sd)
			return
		}
		s.emit(sd, f)
	}
}

func (s *Stream) sendBody(sd *side, b []byte, eos bool) {
	msg := &extprocv3.HttpBody{Body: slices.Clone(b), EndOfStream: eos}
	if sd.dir == dirRequest {
		s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: msg}})
	} else {
		s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: msg}})
	}
}

func (s *Stream) sendTrailers(sd *side) {
	msg := &extprocv3.HttpTrailers{Trailers: sd.trailers.toProto()}
	if sd.dir == dirRequest {
		s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: msg}})
	} else {
		s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: msg}})
	}
}

func (s *Stream) startTimer(sd *side) {
	sd.timeoutOverridden = false
	if !sd.body.runsTimer() {
		return // FULL_DUPLEX_STREAMED runs no message timer
	}
	sd.timer.Reset(s.c.cfg.messageTimeout())
	sd.timerOn = true
}

// send opens the gRPC stream if needed and sends m, adding protocol_config
// on the first message and metadata_context on every one.
func (s *Stream) send(m *extprocv3.ProcessingRequest) {
	if s.complete {
		return
	}
	if !s.opened {
		s.opened = true
		ctx, cancel := context.WithCancel(s.ctx)
		st, err := s.c.ext.Process(ctx)
		if err != nil {
			cancel()
			s.grpcClosed = true
			s.onGRPCError(err)
			return
		}
		s.grpc, s.grpcCancel = st, cancel
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				r, err := st.Recv()
				s.msgs.push(recvItem{r, err})
				if err != nil {
					return
				}
			}
		}()
		mode := s.c.cfg.mode()
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  mode.GetRequestBodyMode(),
			ResponseBodyMode: mode.GetResponseBodyMode(),
		}
	}
	if len(s.c.cfg.ForwardingNamespaces) > 0 {
		md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
		s.infoMu.Lock()
		for _, ns := range s.c.cfg.ForwardingNamespaces {
			if st, ok := s.info.DynamicMetadata[ns]; ok {
				md.FilterMetadata[ns] = proto.Clone(st).(*structpb.Struct)
			}
		}
		s.infoMu.Unlock()
		m.MetadataContext = md
	}
	s.updateInfo(func(i *Info) { i.MessagesSent++ })
	if s.grpcClosed {
		return
	}
	// A failed Send's real status comes from Recv.
	_ = s.grpc.Send(m)
}

func (s *Stream) closeGRPC() {
	if s.opened && !s.grpcClosed {
		s.grpcClosed = true
		// Envoy half-closes and resets; the reset is what the server
		// observes (CANCELLED), so only the reset is reproduced.
		s.grpcCancel()
	}
}
