package sim

import (
	"testing"

	"github.com/kvgate/kvgate/mocker"
)

func TestCausalCapacityOracle(t *testing.T) {
	timing := mocker.DefaultTiming{}
	for _, tc := range []struct {
		name   string
		lines  []string
		causal func(capacity, causal float64) bool
	}{
		// Far apart, every block is computed before the next request
		// arrives: causality changes nothing.
		{"spaced", []string{mooncakeLine(0, 4, 1, 2, 3), mooncakeLine(10000, 4, 1, 2, 3, 4), mooncakeLine(20000, 4, 1, 2, 5)},
			func(c, x float64) bool { return x == c && c > 0 }},
		// Three requests on one prefix arriving together: nobody has
		// computed it yet, so only the capacity oracle counts hits.
		{"simultaneous", []string{mooncakeLine(0, 4, 1, 2, 3), mooncakeLine(0, 4, 1, 2, 3), mooncakeLine(1, 4, 1, 2, 3)},
			func(c, x float64) bool { return x == 0 && c > 0.6 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl, err := newWorkload(loadTestTrace(t, tc.lines), 16, 1)
			if err != nil {
				t.Fatal(err)
			}
			c := capacityOracleHitRatio(wl, 1<<16)
			x := causalCapacityOracleHitRatio(wl, 1<<16, 8192, timing)
			if !tc.causal(c, x) {
				t.Errorf("capacity oracle %.3f, causal %.3f", c, x)
			}
		})
	}
}
