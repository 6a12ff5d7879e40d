package extprocclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// FrameKind says what a Frame carries.
type FrameKind int

// Frame kinds, in the order HTTP sends them in one direction.
const (
	FrameHeaders FrameKind = iota + 1
	FrameData
	FrameTrailers
)

func (k FrameKind) String() string {
	switch k {
	case FrameHeaders:
		return "headers"
	case FrameData:
		return "data"
	case FrameTrailers:
		return "trailers"
	}
	return "frame(" + strconv.Itoa(int(k)) + ")"
}

// Frame is one codec event of one direction: headers, a data chunk, or
// trailers. Trailers always end the direction.
type Frame struct {
	Kind      FrameKind
	Headers   Headers // FrameHeaders, FrameTrailers
	Data      []byte  // FrameData
	EndStream bool    // FrameHeaders, FrameData: nothing follows
}

// LocalReply is a reply the filter sent itself (Envoy's sendLocalReply).
type LocalReply struct {
	Status  int
	Headers Headers // without :status
	Body    []byte
	// Details is what Envoy puts in %RESPONSE_CODE_DETAILS%, e.g.
	// "ext_proc_error_per-message_timeout_exceeded".
	Details string
}

// Info is what the filter recorded for one request.
type Info struct {
	// DynamicMetadata is the request's dynamic metadata after the filter:
	// the initial metadata plus what the server wrote into receiving
	// namespaces.
	DynamicMetadata map[string]*structpb.Struct
	// RouteCacheCleared reports an honoured clear_route_cache.
	RouteCacheCleared bool
	// ClearRouteCacheIgnored counts clear_route_cache requests Envoy ignores
	// (response path, no header mutation in the same response, disabled).
	ClearRouteCacheIgnored int
	// RejectedMutations counts header mutations refused by the mutation
	// rules and ignored (Envoy's rejected_header_mutations).
	RejectedMutations int
	// MetadataNamespacesIgnored counts dynamic metadata namespaces dropped
	// because they are not receiving namespaces.
	MetadataNamespacesIgnored int
	// SpuriousMessages counts out-of-order or unexpected server messages.
	SpuriousMessages int
	// MessagesSent counts ProcessingRequests sent; zero means no gRPC
	// stream was opened at all.
	MessagesSent int
	// LocalReply is set when the filter answered the request itself.
	LocalReply *LocalReply
}

type direction int

const (
	dirRequest direction = iota
	dirResponse
)

func (d direction) String() string {
	if d == dirRequest {
		return "request"
	}
	return "response"
}

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
	c      *Client
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
	switch {
	case s.complete, sd.fds(), sd.cb == cbIdle:
		return true
	case sd.cb == cbStreamedBody && f.Kind == FrameData && sd.bodyMode == extprocfilterv3.ProcessingMode_STREAMED:
		return true
	}
	return false
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
		switch sd.bodyMode {
		case extprocfilterv3.ProcessingMode_BUFFERED:
			sd.buf = append(sd.buf, f.Data...)
			sd.bufActive = true
			if len(sd.buf) > s.c.cfg.bufferLimit() {
				if sd.dir == dirRequest {
					s.localReply(413, nil, []byte("Payload Too Large"), "request_payload_too_large")
				} else {
					s.localReply(500, nil, []byte("Internal Server Error"), "response_payload_too_large")
				}
				return
			}
			if f.EndStream {
				sd.bodySent, sd.cb = true, cbBufferedBody
				s.startTimer(sd)
				s.sendBody(sd, sd.buf, true)
			}
		case extprocfilterv3.ProcessingMode_STREAMED:
			sd.chunks = append(sd.chunks, f)
			sd.cb = cbStreamedBody
			s.startTimer(sd)
			s.sendBody(sd, f.Data, f.EndStream)
		case extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
			// The original bytes are drained: only what the server streams
			// back reaches the peer.
			sd.fdsBodySent = true
			s.sendBody(sd, f.Data, f.EndStream)
		default:
			s.emit(sd, f)
		}
	case FrameTrailers:
		sd.trailers = f.Headers
		switch {
		case sd.fds():
			sd.fdsTrailersSent = true
			s.sendTrailers(sd)
		case sd.bodyMode == extprocfilterv3.ProcessingMode_BUFFERED && sd.bufActive && !sd.bodySent:
			// The buffered body goes out when trailers arrive, without
			// end_of_stream; the trailers follow its reply.
			sd.bodySent, sd.cb, sd.trailersHeld = true, cbBufferedBody, true
			s.startTimer(sd)
			s.sendBody(sd, sd.buf, false)
		default:
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
	if sd.fds() {
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

// failOpen is Envoy's failureModeAllow(): fail-open does not survive body
// data sent in FULL_DUPLEX_STREAMED, whose original bytes are gone.
func (s *Stream) failOpen() bool {
	if (s.req.fds() && s.req.fdsBodySent) || (s.resp.fds() && s.resp.fdsBodySent) {
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
	s.complete = true
	s.closeGRPC()
	s.clearAsyncState()
}

func (s *Stream) onGRPCError(err error) {
	if s.complete {
		return
	}
	st := status.Convert(err)
	if s.failOpen() {
		s.onGRPCClose()
		return
	}
	s.errorReply(fmt.Sprintf("ext_proc_error_gRPC_error_%d{%s}", int(st.Code()), st.Message()), s.c.cfg.statusOnError())
}

func (s *Stream) onMessageTimeout() {
	if s.complete {
		return
	}
	if s.failOpen() {
		s.complete = true
		s.closeGRPC()
		s.clearAsyncState()
		return
	}
	s.errorReply("ext_proc_error_per-message_timeout_exceeded", 504)
}

func (s *Stream) errorReply(details string, code int) {
	s.localReply(code, nil, nil, details)
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
		for _, c := range sd.chunks {
			s.emit(sd, c)
		}
		sd.chunks = nil
		if sd.bufActive {
			s.emit(sd, Frame{Kind: FrameData, Data: sd.buf, EndStream: sd.bodySent && !sd.trailersHeld})
			sd.buf, sd.bufActive = nil, false
		}
		if sd.trailersHeld {
			sd.trailersHeld = false
			s.emit(sd, Frame{Kind: FrameTrailers, Headers: sd.trailers})
		}
		if sd.fds() && !sd.ended && sd.inputEnded && len(sd.pending) == 0 && sd.headersReleased {
			// FULL_DUPLEX_STREAMED drained the original body: end the
			// direction with what is left.
			if sd.fdsTrailersSent {
				s.emit(sd, Frame{Kind: FrameTrailers, Headers: sd.trailers})
			} else {
				s.emit(sd, Frame{Kind: FrameData, EndStream: true})
			}
		}
		s.pump(sd)
	}
}

// spuriousError is Envoy's FailedPrecondition: a message out of order.
type spuriousError struct{ msg string }

func (e spuriousError) Error() string { return e.msg }

func (s *Stream) onResponse(r *extprocv3.ProcessingResponse) {
	if r.GetOverrideMessageTimeout() != nil {
		s.onNewTimeout(r.GetOverrideMessageTimeout().AsDuration())
		return
	}
	cfg := s.c.cfg
	mode := cfg.mode()
	if cfg.AllowModeOverride && r.GetModeOverride() != nil &&
		mode.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED &&
		mode.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED &&
		(s.req.cb == cbHeaders || s.resp.cb == cbHeaders) {
		eff := effectiveModeOverride(r.GetModeOverride(), mode)
		s.req.setMode(eff)
		s.resp.setMode(eff)
	}
	var err error
	switch v := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		s.setDynamicMetadata(r)
		err = s.handleHeaders(s.req, v.RequestHeaders.GetResponse())
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		s.setDynamicMetadata(r)
		err = s.handleHeaders(s.resp, v.ResponseHeaders.GetResponse())
	case *extprocv3.ProcessingResponse_RequestBody:
		s.setDynamicMetadata(r)
		err = s.handleBody(s.req, v.RequestBody.GetResponse())
	case *extprocv3.ProcessingResponse_ResponseBody:
		s.setDynamicMetadata(r)
		err = s.handleBody(s.resp, v.ResponseBody.GetResponse())
	case *extprocv3.ProcessingResponse_RequestTrailers:
		s.setDynamicMetadata(r)
		err = s.handleTrailers(s.req, v.RequestTrailers.GetHeaderMutation())
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		s.setDynamicMetadata(r)
		err = s.handleTrailers(s.resp, v.ResponseTrailers.GetHeaderMutation())
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		if cfg.DisableImmediateResponse {
			err = spuriousError{"unhandled immediate response due to config disabled it"}
			break
		}
		s.setDynamicMetadata(r)
		s.immediateResponse(v.ImmediateResponse)
		return
	default:
		err = spuriousError{"unhandled message"}
	}
	var sp spuriousError
	switch {
	case err == nil:
	case errors.As(err, &sp):
		s.updateInfo(func(i *Info) { i.SpuriousMessages++ })
		s.c.log.Debug("spurious ext_proc message", "error", err)
		if s.failOpen() {
			s.complete = true
			s.closeGRPC()
			s.clearAsyncState()
			return
		}
		s.errorReply(err.Error(), cfg.statusOnError())
	default:
		s.errorReply(err.Error(), cfg.statusOnError())
	}
}

// effectiveModeOverride: DEFAULT header modes leave the configured mode,
// body modes always replace.
func effectiveModeOverride(target, existing *extprocfilterv3.ProcessingMode) *extprocfilterv3.ProcessingMode {
	m := proto.Clone(existing).(*extprocfilterv3.ProcessingMode)
	if target.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.RequestHeaderMode = target.GetRequestHeaderMode()
	}
	if target.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.ResponseHeaderMode = target.GetResponseHeaderMode()
	}
	if target.GetRequestTrailerMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.RequestTrailerMode = target.GetRequestTrailerMode()
	}
	if target.GetResponseTrailerMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.ResponseTrailerMode = target.GetResponseTrailerMode()
	}
	m.RequestBodyMode = target.GetRequestBodyMode()
	m.ResponseBodyMode = target.GetResponseBodyMode()
	return m
}

// onNewTimeout handles override_message_timeout: once per call, within
// 1 ms..max_message_timeout, and only while a call is pending.
func (s *Stream) onNewTimeout(d time.Duration) {
	max := s.c.cfg.MaxMessageTimeout
	if max == 0 || d < time.Millisecond || d > max {
		return
	}
	for _, sd := range []*side{s.req, s.resp} {
		if sd.timerOn && !sd.timeoutOverridden {
			sd.timeoutOverridden = true
			sd.timer.Reset(d)
		}
	}
}

func (s *Stream) setDynamicMetadata(r *extprocv3.ProcessingResponse) {
	dm := r.GetDynamicMetadata()
	if dm == nil {
		return
	}
	recv := s.c.cfg.ReceivingNamespaces
	s.updateInfo(func(i *Info) {
		for _, ns := range slices.Sorted(maps.Keys(dm.GetFields())) {
			v := dm.GetFields()[ns].GetStructValue()
			if v == nil || !slices.Contains(recv, ns) {
				i.MetadataNamespacesIgnored++
				continue
			}
			cur, ok := i.DynamicMetadata[ns]
			if !ok {
				cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			} else {
				cur = proto.Clone(cur).(*structpb.Struct)
			}
			for k, fv := range v.GetFields() {
				cur.Fields[k] = proto.Clone(fv).(*structpb.Value)
			}
			i.DynamicMetadata[ns] = cur
		}
	})
}

// clearRouteCache: request direction only, and only when the same response
// carries a header mutation.
func (s *Stream) clearRouteCache(sd *side, c *extprocv3.CommonResponse) {
	if !c.GetClearRouteCache() {
		return
	}
	honoured := sd.dir == dirRequest && c.GetHeaderMutation() != nil && !s.c.cfg.DisableClearRouteCache
	s.updateInfo(func(i *Info) {
		if honoured {
			i.RouteCacheCleared = true
		} else {
			i.ClearRouteCacheIgnored++
		}
	})
}

func (s *Stream) mutate(sd *side, h *Headers, m *extprocv3.HeaderMutation, o mutateOptions) error {
	n, err := s.c.checker.applyHeaderMutation(h, m, o)
	if n > 0 {
		s.updateInfo(func(i *Info) { i.RejectedMutations += n })
	}
	return err
}

func (s *Stream) handleHeaders(sd *side, c *extprocv3.CommonResponse) error {
	if sd.cb != cbHeaders {
		return spuriousError{"spurious message: unexpected " + sd.dir.String() + " headers response"}
	}
	sd.stopTimer()
	sd.cb = cbIdle
	replacing := c.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE
	opts := mutateOptions{skipContentLength: sd.removeContentLength() && !sd.noBody, replacing: replacing}
	if err := s.mutate(sd, &sd.headers, c.GetHeaderMutation(), opts); err != nil {
		return err
	}
	s.clearRouteCache(sd, c)
	defer s.pump(sd)
	if replacing {
		// The body becomes body_mutation's, the original is dropped and
		// nothing more is sent for this direction.
		body := c.GetBodyMutation().GetBody()
		sd.headers.Del("content-length")
		sd.replaced, sd.headersHeld = true, false
		sd.pending = slices.DeleteFunc(sd.pending, func(f Frame) bool { return f.Kind != FrameHeaders })
		s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers, EndStream: len(body) == 0})
		if len(body) > 0 {
			s.emit(sd, Frame{Kind: FrameData, Data: body, EndStream: true})
		}
		return nil
	}
	if sd.noBody {
		sd.headersHeld = false
		s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers, EndStream: true})
		return nil
	}
	if sd.bodyMode == extprocfilterv3.ProcessingMode_BUFFERED {
		return nil // held until the body's reply
	}
	sd.headersHeld = false
	s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers})
	return nil
}

func (s *Stream) handleBody(sd *side, c *extprocv3.CommonResponse) error {
	bm := c.GetBodyMutation()
	_, isStreamed := bm.GetMutation().(*extprocv3.BodyMutation_StreamedResponse)
	plain := bm.GetMutation() != nil && !isStreamed
	defer s.pump(sd)
	switch sd.bodyMode {
	case extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if sd.cb == cbHeaders || !sd.fdsBodySent || plain {
			return spuriousError{"spurious message: unexpected " + sd.dir.String() + " body response"}
		}
		s.clearRouteCache(sd, c)
		if sr := bm.GetStreamedResponse(); sr != nil && !sd.replaced {
			s.emit(sd, Frame{Kind: FrameData, Data: sr.GetBody(), EndStream: sr.GetEndOfStream()})
		}
		return nil
	case extprocfilterv3.ProcessingMode_BUFFERED:
		if sd.cb != cbBufferedBody || isStreamed {
			return spuriousError{"spurious message: unexpected " + sd.dir.String() + " body response"}
		}
		sd.stopTimer()
		sd.cb = cbIdle
		if sd.headersHeld {
			// header_mutation applies only while the headers are held.
			if err := s.mutate(sd, &sd.headers, c.GetHeaderMutation(), mutateOptions{skipContentLength: sd.removeContentLength()}); err != nil {
				return err
			}
		}
		s.clearRouteCache(sd, c)
		switch m := bm.GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			sd.buf = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			if m.ClearBody {
				sd.buf = nil
			}
		}
		if sd.headersHeld && sd.headerMode == extprocfilterv3.ProcessingMode_SEND {
			if cl, ok := sd.headers.Get("content-length"); ok && cl != strconv.Itoa(len(sd.buf)) {
				return fmt.Errorf("%w: mismatch between content-length %s and the length of the mutated body %d", errMutation, cl, len(sd.buf))
			}
		}
		if sd.headersHeld {
			sd.headersHeld = false
			s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers})
		}
		s.emit(sd, Frame{Kind: FrameData, Data: sd.buf, EndStream: !sd.trailersHeld})
		sd.buf, sd.bufActive = nil, false
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
	case extprocfilterv3.ProcessingMode_STREAMED:
		if len(sd.chunks) == 0 || isStreamed {
			return spuriousError{"spurious message: unexpected " + sd.dir.String() + " body response"}
		}
		chunk := sd.chunks[0]
		sd.chunks = sd.chunks[1:]
		// header_mutation in a STREAMED body reply is ignored: the headers
		// are gone already.
		s.clearRouteCache(sd, c)
		data := chunk.Data
		switch m := bm.GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			data = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			if m.ClearBody {
				data = nil
			}
		}
		if len(sd.chunks) == 0 {
			sd.stopTimer()
			sd.cb = cbIdle
		} else {
			s.startTimer(sd)
		}
		s.emit(sd, Frame{Kind: FrameData, Data: data, EndStream: chunk.EndStream})
		return nil
	}
	return spuriousError{"spurious message: " + sd.dir.String() + " body response with body mode NONE"}
}

func (s *Stream) handleTrailers(sd *side, m *extprocv3.HeaderMutation) error {
	if !(sd.cb == cbTrailers || sd.fds() && sd.fdsTrailersSent && !sd.ended) {
		return spuriousError{"spurious message: unexpected " + sd.dir.String() + " trailers response"}
	}
	sd.stopTimer()
	sd.cb = cbIdle
	if err := s.mutate(sd, &sd.trailers, m, mutateOptions{}); err != nil {
		return err
	}
	sd.trailersHeld = false
	s.emit(sd, Frame{Kind: FrameTrailers, Headers: sd.trailers})
	return nil
}

func (s *Stream) immediateResponse(ir *extprocv3.ImmediateResponse) {
	code := int(ir.GetStatus().GetCode())
	if code < 200 {
		code = 200
	}
	var h Headers
	if ir.GetHeaders() != nil {
		if err := s.mutate(s.resp, &h, ir.GetHeaders(), mutateOptions{}); err != nil {
			s.c.log.Debug("immediate response headers refused", "error", err)
		}
	}
	if gs := ir.GetGrpcStatus(); gs != nil {
		h.Set("grpc-status", strconv.Itoa(int(gs.GetStatus())))
	}
	s.localReply(code, h, ir.GetBody(), strings.ReplaceAll(ir.GetDetails(), " ", "_"))
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
