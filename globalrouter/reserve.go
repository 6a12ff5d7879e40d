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
// see it and a burst spreads without a second round trip and without
// Router.recheckMu. The commit of the chosen pool (and of the chosen
// prefill pool) confirms its reservation without waiting
// (pool.Commit.Reserved, in place); every other reservation is released
// here, without waiting either, once the decision is made, whatever it
// is. A release that is lost, or a global router that dies between its
// probes and its commit, leaves the reservation to its TTL, after which
// the local router drops it and counts it
// (kvgate_localrouter_reservations_total{outcome="expired"}).

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
