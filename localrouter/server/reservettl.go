package server

import (
	"fmt"
	"time"
)

// MaxReserveTTL bounds a reservation's lifetime (reserve_ttl_us), as the
// global router bounds probe.reserve_ttl (globalrouter.MaxReserveTTL): a
// caller, authenticated or not, holds load on a worker by a reservation
// for at most this long (plus the one TTL a lapsed reservation is kept
// for its late confirmation).
const MaxReserveTTL = 10 * time.Second

// reserveTTL reads a unary BestWorker's reserve_ttl_us: above
// MaxReserveTTL, or set without a request id to reserve for, it is refused.
func reserveTTL(us uint32, requestID string) (time.Duration, error) {
	ttl := time.Duration(us) * time.Microsecond
	switch {
	case ttl > MaxReserveTTL:
		return 0, fmt.Errorf("%w: reserve_ttl_us %d is over %d (%s)", errInvalidArgument, us, MaxReserveTTL.Microseconds(), MaxReserveTTL)
	case ttl > 0 && requestID == "":
		return 0, fmt.Errorf("%w: reserve_ttl_us without a request_id to reserve for", errInvalidArgument)
	}
	return ttl, nil
}
