package globalrouter

import "time"

// Observation is one decision as an observer (a status page) sees it.
type Observation struct {
	Time      time.Time
	RequestID string
	Model     string
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
// With an observer every decision is explained (Decision.Explanation set),
// which costs a few microseconds per request.
func WithObserver(observe func(Observation)) Option {
	return func(o *options) { o.observe = observe }
}

// GetID returns the request's ID ("" for a nil request).
func (r *Request) GetID() string {
	if r == nil {
		return ""
	}
	return r.ID
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
