package globalrouter

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
)

// Request headers the global router reads (keys lower-case).
const (
	// HeaderPool pins the request to a pool; refused (ErrPinRefused) when
	// that pool cannot take it.
	HeaderPool = "x-kvgate-pool"
	// HeaderWorkerID pins the request to a worker (with HeaderDPRank, default
	// rank 0), in HeaderPool when set, else in any pool serving the model.
	HeaderWorkerID = "x-kvgate-worker-id"
	HeaderDPRank   = "x-kvgate-dp-rank"
	// HeaderSession is the session key policies see.
	HeaderSession = "x-kvgate-session-id"
	// HeaderPriority is the request's priority (an integer; higher first).
	HeaderPriority = "x-kvgate-priority"
	// HeaderTTFT and HeaderITL are the request's latency targets in ms.
	HeaderTTFT = "x-kvgate-ttft-ms"
	HeaderITL  = "x-kvgate-itl-ms"
	// Per-request overrides of the local routers' cost parameters.
	HeaderOverlapScoreCredit = "x-kvgate-overlap-score-credit"
	HeaderPrefillLoadScale   = "x-kvgate-prefill-load-scale"
	HeaderRouterTemperature  = "x-kvgate-router-temperature"
)

// headers are a request's x-kvgate-* headers, parsed and validated before
// anything costly (tokenizing, hashing) is done for the request.
type headers struct {
	pinPool, pinWorker string
	// pinRank is HeaderDPRank (0 when unset); read only with pinWorker.
	pinRank  uint32
	session  string
	priority int
	slo      policies.SLO
	override *routing.Override
	// steering is the first steering header the request carries ("" none):
	// pins, priority, SLO targets, overrides (TrustConfig.Steering).
	steering string
}

// steeringHeaders are the headers that steer routing, honoured for the
// callers TrustConfig.Steering allows.
var steeringHeaders = []string{HeaderPool, HeaderWorkerID, HeaderDPRank, HeaderPriority, HeaderTTFT, HeaderITL,
	HeaderOverlapScoreCredit, HeaderPrefillLoadScale, HeaderRouterTemperature}

// parseHeaders reads h; a malformed value is ErrBadRequest (ErrPinRefused
// for HeaderDPRank of a pinned worker), naming the header and the value.
func parseHeaders(h map[string]string) (headers, error) {
	out := headers{pinPool: h[HeaderPool], pinWorker: h[HeaderWorkerID], session: h[HeaderSession]}
	for _, name := range steeringHeaders {
		if _, ok := h[name]; ok {
			out.steering = name
			break
		}
	}
	var err error
	if s := h[HeaderPriority]; s != "" {
		if out.priority, err = strconv.Atoi(s); err != nil {
			return out, fmt.Errorf("%w: %s: %q is not an integer", ErrBadRequest, HeaderPriority, s)
		}
	}
	for _, d := range []struct {
		name string
		out  *time.Duration
	}{{HeaderTTFT, &out.slo.TTFT}, {HeaderITL, &out.slo.ITL}} {
		if s := h[d.name]; s != "" {
			ms, err := strconv.ParseFloat(s, 64)
			if err != nil || !finite(ms) || ms < 0 || ms > 1e9 { // up to ~11 days
				return out, fmt.Errorf("%w: %s: %q is not a duration in milliseconds", ErrBadRequest, d.name, s)
			}
			*d.out = time.Duration(ms * float64(time.Millisecond))
		}
	}
	for _, f := range []struct {
		name string
		set  func(*routing.Override, *float64)
	}{
		{HeaderOverlapScoreCredit, func(o *routing.Override, v *float64) { o.OverlapScoreCredit = v }},
		{HeaderPrefillLoadScale, func(o *routing.Override, v *float64) { o.PrefillLoadScale = v }},
		{HeaderRouterTemperature, func(o *routing.Override, v *float64) { o.RouterTemperature = v }},
	} {
		if s := h[f.name]; s != "" {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil || !finite(x) || x < 0 {
				return out, fmt.Errorf("%w: %s: %q is not a non-negative number", ErrBadRequest, f.name, s)
			}
			if out.override == nil {
				out.override = &routing.Override{}
			}
			f.set(out.override, &x)
		}
	}
	if s := h[HeaderDPRank]; s != "" && out.pinWorker != "" {
		v, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return out, fmt.Errorf("%w: %s: %q is not a rank", ErrPinRefused, HeaderDPRank, s)
		}
		out.pinRank = uint32(v)
	}
	return out, nil
}

// finite reports whether x is neither NaN nor ±Inf (ParseFloat accepts
// both, and a NaN cost orders nothing).
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// view is the policies' view of the request.
func (h *headers) view(req *Request, id string, isl int) policies.Request {
	return policies.Request{ID: id, Model: req.Model, Path: req.Path, ISL: isl, Headers: req.Headers, SessionKey: h.session, Priority: h.priority, SLO: h.slo}
}
