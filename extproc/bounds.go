package extproc

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bounds on ext_proc streams (issue 27 item 3). Envoy ends its own streams
// (its HTTP connection manager's stream_idle_timeout, 300 s by default, and
// for the non-full-duplex modes the ext_proc filter's message_timeout, 200
// ms; FULL_DUPLEX_STREAMED has no message timer: envoyproxy/envoy
// api/envoy/extensions/filters/http/ext_proc/v3/ext_proc.proto), but
// anything that reaches the port can open streams and hold them. The
// defaults sit above what Envoy's own defaults let through, so real Envoy
// traffic never meets them:
//   - DefaultMaxStreams concurrent streams; past it a new stream is refused
//     with RESOURCE_EXHAUSTED;
//   - DefaultRequestTimeout from stream open to a complete request (headers,
//     and the body when the request is routed);
//   - DefaultIdleTimeout with no message on the stream while the request is
//     in flight and its response has not started (the phase in which a
//     routed request holds load on its router). Once response headers
//     arrive no bound applies: a streamed generation may run for minutes.
//
// A bound that fires ends the stream with DEADLINE_EXCEEDED and frees the
// router load it held; each refusal counts in
// kvgate_extproc_streams_refused_total{reason}.
const (
	DefaultMaxStreams     = 20000
	DefaultRequestTimeout = 5 * time.Minute
	DefaultIdleTimeout    = 10 * time.Minute
)

// Reasons of kvgate_extproc_streams_refused_total.
const (
	refusedMaxStreams = "max_streams"
	refusedRequest    = "request_timeout"
	refusedIdle       = "idle_timeout"
)

// Phases of a bounded exchange, as the watcher reads them.
const (
	phaseRequest  int32 = iota // the request is not complete yet
	phaseWaiting               // complete (routed or passed through); no response yet
	phaseResponse              // response headers arrived: unbounded
)

// bounds is one stream's watch: the runner goroutine stores the phase and
// the time of the last message, the watcher reads them when its timer fires.
type bounds struct {
	opened time.Time
	last   atomic.Int64 // unix ns of the last message received
	phase  atomic.Int32
}

func newRefusedCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_extproc_streams_refused_total",
		Help: "ext_proc streams refused or ended by a bound, by reason (max_streams: over -max-streams; request_timeout: no complete request within -stream-request-timeout; idle_timeout: nothing received for -stream-idle-timeout before the response started).",
	}, []string{"reason"})
	for _, r := range []string{refusedMaxStreams, refusedRequest, refusedIdle} {
		c.WithLabelValues(r)
	}
	return c, reg.Register(c)
}

// admit takes a stream slot, or reports that MaxStreams are open.
func (s *Server) admit() bool {
	if s.cfg.MaxStreams <= 0 {
		return true
	}
	if s.open.Add(1) > int64(s.cfg.MaxStreams) {
		s.open.Add(-1)
		s.m.refused.WithLabelValues(refusedMaxStreams).Inc()
		return false
	}
	return true
}

func (s *Server) release() {
	if s.cfg.MaxStreams > 0 {
		s.open.Add(-1)
	}
}

// bounded reports whether streams run under a watcher.
func (s *Server) bounded() bool { return s.cfg.RequestTimeout > 0 || s.cfg.IdleTimeout > 0 }

// runBounded runs the exchange on a goroutine of its own while this one
// (the gRPC handler's) watches the bounds: a handler blocked in Recv cannot
// be woken, and returning from the handler is what ends the stream (grpc-go
// then cancels its context, Recv returns, and the exchange frees its load).
func (x *exchange) runBounded(release func()) error {
	b := &bounds{opened: time.Now()}
	b.last.Store(b.opened.UnixNano())
	x.bounds = b
	done := make(chan error, 1)
	go func() {
		defer release()
		defer x.finish()
		done <- x.run()
	}()
	t := time.NewTimer(x.s.nextCheck(b, time.Now()))
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case now := <-t.C:
			reason, wait := x.s.check(b, now)
			if reason != "" {
				x.s.m.refused.WithLabelValues(reason).Inc()
				x.s.noteRefusal(reason)
				return status.Errorf(codes.DeadlineExceeded, "ext_proc stream ended: %s", reason)
			}
			if wait < 0 {
				return <-done // response started: no bound left
			}
			t.Reset(wait)
		}
	}
}

// nextCheck is the first wait of a stream's watcher.
func (s *Server) nextCheck(b *bounds, now time.Time) time.Duration {
	_, wait := s.check(b, now)
	if wait < 0 {
		wait = 0
	}
	return wait
}

// check says which bound, if any, b has passed at now, or how long until
// the next may pass (negative: none can any more).
func (s *Server) check(b *bounds, now time.Time) (reason string, wait time.Duration) {
	phase := b.phase.Load()
	if phase == phaseResponse {
		return "", -1
	}
	wait = -1
	if s.cfg.RequestTimeout > 0 && phase == phaseRequest {
		left := s.cfg.RequestTimeout - now.Sub(b.opened)
		if left <= 0 {
			return refusedRequest, 0
		}
		wait = left
	}
	if s.cfg.IdleTimeout > 0 {
		left := s.cfg.IdleTimeout - now.Sub(time.Unix(0, b.last.Load()))
		if left <= 0 {
			return refusedIdle, 0
		}
		if wait < 0 || left < wait {
			wait = left
		}
	}
	if wait < 0 {
		return "", -1
	}
	return "", wait
}

// noteMessage records a received message and the phase it left the
// exchange in (runner goroutine).
func (x *exchange) noteMessage() {
	b := x.bounds
	if b == nil {
		return
	}
	b.last.Store(time.Now().UnixNano())
	switch {
	case x.responseStarted:
		b.phase.Store(phaseResponse)
	case x.decided || x.passThrough:
		b.phase.Store(phaseWaiting)
	}
}

// noteRefusal logs a bound's refusal, at most once per second per server
// (thousands of streams may pass a bound together).
func (s *Server) noteRefusal(reason string) {
	now := time.Now().UnixNano()
	last := s.lastRefusalLog.Load()
	if now-last < int64(time.Second) || !s.lastRefusalLog.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("ext_proc stream ended by a bound", "reason", reason,
		"max_streams", s.cfg.MaxStreams, "request_timeout", s.cfg.RequestTimeout, "idle_timeout", s.cfg.IdleTimeout)
}
