package loadbench

import (
	"math"
	"testing"
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
