package mocker

import "time"

// RequestObserver is told when a rank's engine takes a request in and when
// it lets the request go: the two moments the rank's running+waiting count
// (Stats) changes for it. It is how a benchmark compares, request by
// request, what the engines ran with what the routers counted (`kvgate bench
// -chaos -accounting`). The calls are made under the rank's lock, in the
// order the count changes: an observer must be quick, must not block and
// must not call the Server.
type RequestObserver interface {
	// Admitted: rank's engine took request id (the mocker's own id, the
	// response's "id"); clientID is the HTTP request's X-Request-Id ("" when
	// it had none).
	Admitted(rank int, id, clientID string, at time.Time)
	// Left: the request is no longer running or waiting on rank: finished
	// (reason FinishLength) or aborted because its client went away
	// (FinishAbort).
	Left(rank int, id string, at time.Time, reason string)
}

// HeaderRequestID is the header a request's client id is read from for a
// RequestObserver.
const HeaderRequestID = "X-Request-Id"
