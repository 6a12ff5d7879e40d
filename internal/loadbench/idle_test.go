package loadbench

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
)

// TestIdleStreamsBounded is the idle-streams benchmark small enough for
// make test (kvgate bench -idle runs 10,000): two rounds of 300 silent
// streams against a server bounded at 100: every stream ends refused (over
// the limit) or closed (past the request timeout, never before it), the
// server's counters say the same, and no stream or goroutine is left.
func TestIdleStreamsBounded(t *testing.T) {
	res, err := Idle(testenv.Context(t), IdleConfig{Streams: 300, Conns: 3, MaxStreams: 100, RequestTimeout: 500 * time.Millisecond, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.Other != 0 || res.Refused+res.Closed != res.Streams {
		t.Fatalf("refused %d + closed %d of %d streams, %d otherwise (first: %s); want every stream refused or closed", res.Refused, res.Closed, res.Streams, res.Other, res.FirstOther)
	}
	if res.Refused == 0 || res.Closed == 0 {
		t.Errorf("refused %d, closed %d: want both bounds to act", res.Refused, res.Closed)
	}
	if got := res.ServerRefused["max_streams"]; got != float64(res.Refused) {
		t.Errorf("server counted %v max_streams refusals, the client saw %d", got, res.Refused)
	}
	if got := res.ServerRefused["request_timeout"]; got != float64(res.Closed) {
		t.Errorf("server counted %v request_timeout closes, the client saw %d", got, res.Closed)
	}
	if res.ClosedAfterMin < res.RequestTimeout {
		t.Errorf("a stream was closed after %v, before the request timeout %v", res.ClosedAfterMin, res.RequestTimeout)
	}
	if res.ActiveAfter != 0 {
		t.Errorf("streams active after: %v, want 0", res.ActiveAfter)
	}
	if res.GoroutinesAfter > res.GoroutinesBefore {
		t.Errorf("goroutines after %d, before %d", res.GoroutinesAfter, res.GoroutinesBefore)
	}
}
