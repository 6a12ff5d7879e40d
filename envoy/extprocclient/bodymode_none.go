package extprocclient

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// modeNone is body mode NONE: nothing of the body is sent; data passes.
type modeNone struct{}

func (modeNone) removesContentLength(extprocfilterv3.ProcessingMode_HeaderSendMode) bool {
	return false
}
func (modeNone) admits(*side, Frame) bool            { return false }
func (modeNone) runsTimer() bool                     { return true }
func (modeNone) drained(*side) bool                  { return false }
func (modeNone) holdsHeaders() bool                  { return false }
func (modeNone) onData(s *Stream, sd *side, f Frame) { s.emit(sd, f) }
func (modeNone) onTrailers(*Stream, *side) bool      { return false }
func (modeNone) trailersPending(*side) bool          { return false }
func (modeNone) finish(*Stream, *side)               {}
func (modeNone) onBodyResponse(_ *Stream, sd *side, _ *extprocv3.CommonResponse) error {
	return spuriousError{"spurious message: " + sd.dir.String() + " body response with body mode NONE"}
}
