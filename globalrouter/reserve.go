package globalrouter

import (
	"context"
	"errors"
	"slices"

	"github.com/kvgate/kvgate/pool"
)

// probe.commit: reserve. Every probe reserves, on its pool's local router,
// the worker it names for the request (pool.Prompt.ReserveID, for
// ProbeConfig.ReserveTTL): the router counts the request's load there at
// once, so the probes that follow — this global router's or another's —
// see it and a burst over one pool spreads without a second round trip
// and without Router.recheckMu (over several, see contended decisions
// below). The commit of the chosen pool (and of the chosen prefill pool)
// confirms its reservation without waiting (pool.Commit.Reserved, in
// place; pool.Commit.Unanswered within half the TTL of the probe: the
// request id and the worker only, never answered, where the local router
// takes it); every other reservation is released
// here, without waiting either, once the decision is made, whatever it
// is. A release that is lost, or a global router that dies between its
// probes and its commit, leaves the reservation to its TTL, after which
// the local router drops it and counts it
// (kvgate_localrouter_reservations_total{outcome="expired"}).

// Contended decisions. Each probe reserves on its own pool, so while a
// burst is in flight every pool counts a reservation of every request,
// though each request will keep only one: the pools' answers, taken at
// different moments, count different shares of reservations that are to
// be released, and every request of a burst can see the same pool as the
// cheaper (BENCHMARKS.md, reserving probes). A reserving probe's answer
// says how many other requests' reservations its router held
// (routing.Selection.ReservationsHeld). A decision over several pools
// whose answers counted none is made in one round trip, as above. One
// whose answers counted some is contended: its own reservations are
// released at once (so that they weigh on nobody while it waits), it
// takes Router.recheckMu, as decide's contended commits do, and probes
// every pool again, reserving; it holds the lock until its confirmation
// and releases are sent. A router's contended decisions thus follow one
// another, each probed after the previous one's confirmation and releases
// went out on the same channels (a channel's messages are handled in
// order), so each sees the choices made before it, as decide's waited
// recheck provides, with two round trips instead of decide's up to four.
// The lock is never taken by a decision over one pool, nor by one that
// met no other reservation (a sequential stream of decisions).

// contended reports whether several pools answered and any answer counted
// another request's reservation.
func contended(results []probeResult) bool {
	answered, held := 0, false
	for _, res := range results {
		if res.err == nil {
			answered++
			held = held || res.sel.ReservationsHeld > 0
		}
	}
	return answered > 1 && held
}

// reprobeContended releases the reservations of the contended probes
// results, takes the recheck lock (waiting at most the probe timeout;
// locked says whether it did: the caller releases it once its decision's
// messages are sent) and probes eligible again, reserving.
func (r *Router) reprobeContended(ctx context.Context, st *state, p *prepared, eligible []*poolEntry, results []probeResult) (_ []probeResult, locked bool) {
	// Released in order: each pool handles the release before the probe
	// that reserves again for the same request (a release overtaking it
	// would release the new reservation). Only the answered probes': one
	// that timed out may still be running on its router, whose probe
	// again replaces what it reserved (a release would be deferred past
	// both, localrouter/server's reserveDone).
	for _, res := range results {
		if res.err != nil || res.sel.Router == "" {
			continue
		}
		res.pe.p.ReleaseOrdered(context.WithoutCancel(ctx), res.sel.Router, p.id)
		r.m.reservationsReleased.WithLabelValues(res.pe.cfg.Name).Inc()
	}
	locked = r.lockRecheck(ctx, st.cfg.Probe.Timeout)
	outcome := "locked"
	if !locked {
		outcome = "busy"
	}
	r.m.reprobes.WithLabelValues(outcome).Inc()
	p.probed = r.opts.now()
	return r.probe(ctx, p, eligible, false), locked
}

// heldReservation is a reservation a probe answered with.
type heldReservation struct {
	pe     *poolEntry
	router string
}

// heldReservations are the reservations the probes may hold: those of
// the probes that answered, taken before anything (the subset filter)
// marks an answer as an error, and those of the probes whose answer did
// not come in time (the router may have reserved before the deadline; a
// release of nothing is NOT_FOUND and changes nothing). A probe the
// router refused reserved nothing.
func heldReservations(results []probeResult) []heldReservation {
	out := make([]heldReservation, 0, len(results))
	for _, res := range results {
		var pe *pool.ProbeError
		switch {
		case res.err == nil && res.sel.Router != "":
			out = append(out, heldReservation{pe: res.pe, router: res.sel.Router})
		case errors.As(res.err, &pe) && pe.Router != "" && !pe.Request:
			out = append(out, heldReservation{pe: res.pe, router: pe.Router})
		}
	}
	return out
}

// releaseReservations releases the reservations of held that no commit of
// p confirmed. Releases are sent, not waited for.
func (r *Router) releaseReservations(ctx context.Context, p *prepared, held []heldReservation) {
	ctx = context.WithoutCancel(ctx)
	for _, h := range held {
		if slices.Contains(p.confirmed, h.pe.cfg.Name) {
			continue
		}
		h.pe.p.Release(ctx, h.router, p.id)
		r.m.reservationsReleased.WithLabelValues(h.pe.cfg.Name).Inc()
	}
}
