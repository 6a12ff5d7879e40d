package extproc_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// counterValue sums the counter samples of name that carry label value
// want (any label).
func counterValue(t *testing.T, reg *prometheus.Registry, name, want string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == want {
					sum += m.GetCounter().GetValue()
					break
				}
			}
		}
	}
	return sum
}
