package grafana

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMetricSelectors(t *testing.T) {
	for _, tt := range []struct {
		expr string
		want []Selector
		err  bool
	}{
		{expr: `sum by (pool, code) (rate(kvgate_extproc_requests_total[$__rate_interval]))`, want: []Selector{{Metric: "kvgate_extproc_requests_total"}}},
		{expr: `histogram_quantile(0.99, sum by (le) (rate(a_bucket{outcome!="ok", pool=~"p.*"}[5m])))`, want: []Selector{{Metric: "a_bucket", Labels: []string{"outcome", "pool"}}}},
		{expr: `sum(rate(x{agree="true"}[1m])) / sum(rate(x[1m])) > bool 0.5`, want: []Selector{{Metric: "x", Labels: []string{"agree"}}, {Metric: "x"}}},
		{expr: `max by (instance) (vllm:kv_cache_usage_perc)`, want: []Selector{{Metric: "vllm:kv_cache_usage_perc"}}},
		{expr: `a and on (pool) b`, want: []Selector{{Metric: "a"}, {Metric: "b"}}},
		{expr: `{__name__="a"}`, err: true},
		{expr: `frobnicate(a)`, err: true},
		{expr: `rate(a[$interval])`, err: true},
		{expr: `a{b=c}`, err: true},
		{expr: `a{b="c"`, err: true},
		{expr: `sum by pool (a)`, err: true},
	} {
		got, err := MetricSelectors(tt.expr)
		if tt.err {
			if err == nil {
				t.Errorf("MetricSelectors(%q) = %v, want an error", tt.expr, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("MetricSelectors(%q): %v", tt.expr, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("MetricSelectors(%q) (-want +got):\n%s", tt.expr, diff)
		}
	}
}

// FuzzMetricSelectors: any text is read or refused, never a panic.
func FuzzMetricSelectors(f *testing.F) {
	for _, s := range []string{`sum by (a) (rate(m{x="y"}[5m]))`, `a{b="c\"}`, `[`, `{`, `x by (`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { _, _ = MetricSelectors(s) })
}
