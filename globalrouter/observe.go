package globalrouter

import (
	"sync/atomic"
	"time"
)

// Observation is one decision as an observer (a status page) sees it.
type Observation struct {
	Time      time.Time
	RequestID string
	// ClientID is the client's x-request-id (Request.ClientID), "" when
	// it sent none.
	ClientID string
	Model    string
	// Outcome is "ok" or the error's kind (bad_request, unknown_model,
	// pin_refused, saturated, no_pool, error); Err is the error.
	Outcome  string
	Err      error
	Duration time.Duration
	// Decision is nil when Err is set.
	Decision *Decision
	// Explanation says why the decision went where it did, even when it
	// was withheld from the client (Decision.Expose false).
	Explanation string
}

// WithObserver calls observe after every decision, on the request's
// goroutine: it must not block, and must not keep the Decision's Lease.
//
// Explaining a decision (the policy trace and its text) costs a few
// microseconds and a few dozen allocations, so for the observer alone
// decisions are explained on a sample: at most one every
// ObserverExplainInterval (a status page at tens of requests a second
// sees every one explained; at thousands, a few hundred a second are).
// The others reach the observer with Explanation "". A decision the client
// asked to explain, or any decision while the logger's debug level is on,
// is explained as before.
func WithObserver(observe func(Observation)) Option {
	return func(o *options) {
		o.observe = observe
		o.explainObs = &explainSampler{}
	}
}

// WithFreeObserver calls freed when a decision's Lease is freed (its first
// Free), with the request's id (Observation.RequestID) and the time, before
// the free is sent to the local routers: with WithObserver's decisions and
// the local routers' own records, a benchmark splits a request's way from
// its engine's last token to its router's free into the response's way to
// the ext_proc server and the free's way to the router (`kvgate bench
// -chaos -accounting`). It is called on the freeing goroutine: it must not
// block.
func WithFreeObserver(freed func(id string, at time.Time)) Option {
	return func(o *options) { o.freed = freed }
}

// ObserverExplainInterval is the least time between two decisions explained
// for an observer alone (WithObserver).
const ObserverExplainInterval = 10 * time.Millisecond

// explainSampler lets one decision in each ObserverExplainInterval be
// explained for the observer. Safe for concurrent use.
type explainSampler struct{ next atomic.Int64 } // unix nanoseconds

// take reports whether the decision at now is explained, and if so moves
// the next slot on.
func (s *explainSampler) take(now time.Time) bool {
	if s == nil {
		return false
	}
	t := now.UnixNano()
	n := s.next.Load()
	return t >= n && s.next.CompareAndSwap(n, t+int64(ObserverExplainInterval))
}

// GetID returns the request's ID ("" for a nil request).
func (r *Request) GetID() string {
	if r == nil {
		return ""
	}
	return r.ID
}

// clientID returns the request's ClientID ("" for a nil request).
func (r *Request) clientID() string {
	if r == nil {
		return ""
	}
	return r.ClientID
}

// GetModel returns the request's model ("" for a nil request).
func (r *Request) GetModel() string {
	if r == nil {
		return ""
	}
	return r.Model
}

// ReloadStatus is the last configuration load or reload attempted.
type ReloadStatus struct {
	Time time.Time
	File string
	// Err is why it was refused (nil: taken).
	Err error
}

// LastReload reports the last configuration load or reload attempted (New
// counts as the first).
func (r *Router) LastReload() ReloadStatus {
	if p := r.lastReload.Load(); p != nil {
		return *p
	}
	return ReloadStatus{}
}

func (r *Router) noteReload(file string, err error) {
	r.lastReload.Store(&ReloadStatus{Time: r.opts.now(), File: file, Err: err})
}
