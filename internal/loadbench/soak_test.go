package loadbench

import (
	"math"
	"net"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

func TestHistQuantile(t *testing.T) {
	// Buckets 1, 2, 5 (cumulative 10, 90, 100): 10 at ≤1, 80 in (1,2], 10 in (2,5].
	h := hist{bounds: []float64{1, 2, 5}, counts: []uint64{10, 90, 100}, total: 100}
	for _, tt := range []struct{ q, want float64 }{
		{0.05, 0.5}, {0.5, 1.5}, {0.9, 2}, {0.99, 4.7},
	} {
		if got := h.quantile(tt.q); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := (hist{}).quantile(0.99); got != 0 {
		t.Errorf("empty: %v", got)
	}
	// Past the last bucket (+Inf not listed): its bound.
	over := hist{bounds: []float64{1}, counts: []uint64{1}, total: 10}
	if got := over.quantile(0.99); got != 1 {
		t.Errorf("past the last bucket: %v, want 1", got)
	}
	// The steady state: only what came after the snapshot.
	earlier := hist{bounds: []float64{1, 2, 5}, counts: []uint64{0, 80, 90}, total: 90}
	d := h.minus(earlier)
	if d.total != 10 || d.counts[0] != 10 || d.counts[1] != 10 || d.counts[2] != 10 {
		t.Fatalf("minus: %+v", d)
	}
	if got := d.quantile(0.99); got > 1 {
		t.Errorf("steady p99 %v, want within the first bucket", got)
	}
}

// TestSoakBesideKvgateUp: a soak starts while `kvgate up`'s admin address
// (127.0.0.1:8081) is taken, as when one runs on the machine: its system
// listens on free loopback ports only (it bound the admin's default
// before). The smallest soak: 4 streams on one worker.
func TestSoakBesideKvgateUp(t *testing.T) {
	if l, err := net.Listen("tcp", up.DefaultConfig().AdminAddr); err == nil { // else already taken: the same case
		defer l.Close()
	}
	res, err := Soak(testenv.Context(t), SoakConfig{Streams: 4, Hold: 100 * time.Millisecond, Pools: 1, Workers: 1, SteadyEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Streams != 4 || res.LeakedRequests != 0 || res.Failed != 0 {
		t.Errorf("soak: %d streams, %d leaked, %d failed (%s), want 4, 0, 0", res.Streams, res.LeakedRequests, res.Failed, res.FirstError)
	}
}
