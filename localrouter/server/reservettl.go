package server

import (
	"fmt"
	"time"
)

// reserveTTL reads a unary BestWorker's reserve_ttl_us: set without a
// request id to reserve for, it is refused. Its bound,
// routing.MaxReserveTTL, is the router's own (BestWorker refuses a longer
// reservation with localrouter.ErrReserveTTL, INVALID_ARGUMENT here), the
// one rule of every caller, in process or over gRPC.
func reserveTTL(us uint32, requestID string) (time.Duration, error) {
	ttl := time.Duration(us) * time.Microsecond
	if ttl > 0 && requestID == "" {
		return 0, fmt.Errorf("%w: reserve_ttl_us without a request_id to reserve for", errInvalidArgument)
	}
	return ttl, nil
}
