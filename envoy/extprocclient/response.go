package extprocclient

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

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
	if v, ok := r.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
		if !cfg.DisableImmediateResponse {
			s.setDynamicMetadata(r)
			s.immediateResponse(v.ImmediateResponse)
			return
		}
		err = spuriousError{"unhandled immediate response due to config disabled it"}
	} else if apply := s.phaseAnswer(r); apply != nil {
		s.setDynamicMetadata(r)
		err = apply()
	} else {
		err = spuriousError{"unhandled message"}
	}
	var sp spuriousError
	switch {
	case err == nil:
	case errors.As(err, &sp):
		s.updateInfo(func(i *Info) { i.SpuriousMessages++ })
		s.c.log.Debug("spurious ext_proc message", "error", err)
		s.fail(err.Error(), cfg.statusOnError())
	default:
		s.localReply(cfg.statusOnError(), nil, nil, err.Error())
	}
}

// phaseAnswer is the call that applies r when it answers a headers, body
// or trailers message of either side; nil when r answers none of them.
func (s *Stream) phaseAnswer(r *extprocv3.ProcessingResponse) func() error {
	switch v := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		return func() error { return s.handleHeaders(s.req, v.RequestHeaders.GetResponse()) }
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		return func() error { return s.handleHeaders(s.resp, v.ResponseHeaders.GetResponse()) }
	case *extprocv3.ProcessingResponse_RequestBody:
		return func() error { return s.handleBody(s.req, v.RequestBody.GetResponse()) }
	case *extprocv3.ProcessingResponse_ResponseBody:
		return func() error { return s.handleBody(s.resp, v.ResponseBody.GetResponse()) }
	case *extprocv3.ProcessingResponse_RequestTrailers:
		return func() error { return s.handleTrailers(s.req, v.RequestTrailers.GetHeaderMutation()) }
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		return func() error { return s.handleTrailers(s.resp, v.ResponseTrailers.GetHeaderMutation()) }
	}
	return nil
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
	if sd.body.holdsHeaders() {
		return nil // held until the body's reply
	}
	sd.headersHeld = false
	s.emit(sd, Frame{Kind: FrameHeaders, Headers: sd.headers})
	return nil
}

func (s *Stream) handleBody(sd *side, c *extprocv3.CommonResponse) error {
	defer s.pump(sd)
	return sd.body.onBodyResponse(s, sd, c)
}

func (s *Stream) handleTrailers(sd *side, m *extprocv3.HeaderMutation) error {
	if !(sd.cb == cbTrailers || sd.body.trailersPending(sd) && !sd.ended) {
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
