package extproc

import (
	"context"

	"github.com/kvgate/kvgate/globalrouter"
)

// The request's lifecycle on its local router, driven by the exchange:
// prefill complete at the response's first chunk, free at its end or the
// stream's.

// free releases the request on its local router, once.
func (x *exchange) free() {
	if x.lease == nil || x.freed {
		return
	}
	x.freed = true
	if x.prefilling != nil {
		<-x.prefilling // the prefill complete goes first
	}
	x.leaseCall("free", x.lease.Free)
}

// leaseCall runs a Lease method under LeaseTimeout, on a context that
// outlives the stream (a free after the client left must still reach the
// local router).
func (x *exchange) leaseCall(what string, f func(context.Context) error) {
	x.leaseCallOn(x.current, what, f)
}

// leaseCallOn is leaseCall with the endpoint the request is accounted on
// given, so that it can run off the stream's goroutine (it reads nothing
// else of x that changes).
func (x *exchange) leaseCallOn(ep globalrouter.Endpoint, what string, f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.stream.Context()), x.s.cfg.LeaseTimeout)
	defer cancel()
	if err := f(ctx); err != nil {
		x.log.Warn("lease "+what+" failed", "pool", ep.Pool, "worker", ep.WorkerID, "err", err)
	}
}

// finish runs when the stream ends for any reason.
func (x *exchange) finish() {
	if x.decision != nil && !x.counted {
		x.code = codeClientClosed
		x.count(x.current.Pool)
	}
	x.free()
}

func (x *exchange) count(pool string) {
	if x.counted {
		return
	}
	x.counted = true
	x.s.m.requests.WithLabelValues(pool, x.code).Inc()
}
