package loadbench

import (
	"errors"
	"fmt"
)

// Descriptors of the soak. Each held stream costs about fdsPerStream
// descriptors in the one process: the load client's connection to the
// gateway (both ends, both in process) and the gateway's to its mock
// worker (both ends); fdsBase covers embedded etcd, NATS, the routers'
// gRPC connections, the listeners and the Go runtime's own.
const (
	fdsPerStream = 4
	fdsBase      = 4096
)

// SoakFDs is the RLIMIT_NOFILE a soak of streams streams needs over
// HTTP/1.1 (a connection per stream, both hops).
func SoakFDs(streams int) uint64 { return uint64(streams)*fdsPerStream + fdsBase }

// h2StreamsPerConn is the streams an HTTP/2 connection carries in the soak
// (gateway.MaxConcurrentStreams, the mocker's limit too).
const h2StreamsPerConn = 1000

// SoakFDsHTTP2 is the RLIMIT_NOFILE a soak of streams streams needs when
// both hops multiplex over h2c: per hop, streams/limit + 1 connections of
// two descriptors each (client→gateway; gateway→each of workers workers,
// where the streams spread out and each worker may get its own
// connections).
func SoakFDsHTTP2(streams, workers int) uint64 {
	if workers < 1 {
		workers = 1
	}
	conns := uint64(streams/h2StreamsPerConn+1) + uint64(workers)*uint64(streams/h2StreamsPerConn/workers+1)
	return 2*conns*2 + fdsBase // ×2 for reconnects and spares
}

// soakStreamsFor is how many streams a descriptor limit allows (0 when it
// does not even cover the base).
func soakStreamsFor(limit uint64) int {
	if limit <= fdsBase {
		return 0
	}
	return int((limit - fdsBase) / fdsPerStream)
}

// fdLimiter reads and sets the process's RLIMIT_NOFILE (soft cur, hard max).
type fdLimiter interface {
	Get() (cur, max uint64, err error)
	Set(cur, max uint64) error
}

// ErrFDLimit reports a soak the process's descriptor limit cannot hold.
var ErrFDLimit = errors.New("soak: file-descriptor limit too low")

// raiseFDLimit makes RLIMIT_NOFILE at least SoakFDs(streams): the soft
// limit up to the hard one when that suffices (any user may), else both
// (root only: CAP_SYS_RESOURCE, and at most /proc/sys/fs/nr_open). When it
// cannot, the error (ErrFDLimit) names the limit, what the soak needs and
// how many streams the limit allows, so that the soak refuses before
// starting anything rather than half-running. It returns the soft limit in
// force afterwards.
func raiseFDLimit(l fdLimiter, streams int) (uint64, error) {
	return raiseFDLimitTo(l, streams, SoakFDs(streams), fdsPerStream)
}

// raiseFDLimitTo is raiseFDLimit for a need computed per mode (SoakFDs,
// SoakFDsHTTP2); perStream names the per-stream cost in the error.
func raiseFDLimitTo(l fdLimiter, streams int, need uint64, perStream int) (uint64, error) {
	cur, max, err := l.Get()
	if err != nil {
		return 0, fmt.Errorf("soak: read RLIMIT_NOFILE: %w", err)
	}
	if cur >= need {
		return cur, nil
	}
	newMax := max
	if newMax < need {
		newMax = need
	}
	if err := l.Set(need, newMax); err != nil {
		allowed := max // the most an unprivileged process can reach
		return cur, fmt.Errorf("%w: %d streams need RLIMIT_NOFILE ≥ %d (%d per stream + %d), the limit is %d (hard %d) and raising it failed: %v; "+
			"run as root or raise `ulimit -Hn`, or soak at most %d streams (what the hard limit allows)",
			ErrFDLimit, streams, need, perStream, fdsBase, cur, max, err, soakStreamsFor(allowed))
	}
	// Trust but verify: a limiter that accepts and does not apply is a
	// half-run waiting to happen.
	cur, _, err = l.Get()
	if err != nil {
		return 0, fmt.Errorf("soak: read RLIMIT_NOFILE: %w", err)
	}
	if cur < need {
		return cur, fmt.Errorf("%w: %d streams need RLIMIT_NOFILE ≥ %d, set it but it reads %d; at most %d streams", ErrFDLimit, streams, need, cur, soakStreamsFor(cur))
	}
	return cur, nil
}
