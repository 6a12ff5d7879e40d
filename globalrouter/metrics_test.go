package globalrouter_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/tokenizer"
)

func globalrouterTokenizer(backend, path string) tokenizer.Config {
	return tokenizer.Config{Backend: backend, Path: path}
}

// countByLabel sums counter name's series whose label key is value.
func countByLabel(t *testing.T, reg *prometheus.Registry, name, key, value string) float64 {
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
				if l.GetName() == key && l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: "copy"}, func() float64 { return m.GetCounter().GetValue() })
				}
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return nil
}

// TestMetrics is the golden exposition of the counters and the names of the
// histograms (their buckets hold timings).
func TestMetrics(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, reg := newRouter(t, c.cfg)
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	if _, err := r.Decide(ctx, &globalrouter.Request{Model: "nope", Prompt: "hi"}); err == nil {
		t.Fatal("unknown model decided")
	}
	want := `# HELP kvgate_globalrouter_decisions_total Decisions, one per request, by chosen pool (empty when none) and outcome (a request waiting in the flow-control queue counts once, by how it left it; its tries are kvgate_flowcontrol_tries_total).
# TYPE kvgate_globalrouter_decisions_total counter
kvgate_globalrouter_decisions_total{outcome="ok",pool="` + d.Primary.Pool + `"} 1
kvgate_globalrouter_decisions_total{outcome="unknown_model",pool=""} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvgate_globalrouter_decisions_total"); err != nil {
		t.Error(err)
	}
	for name, n := range map[string]int{
		"kvgate_globalrouter_decision_duration_seconds": 2, // ok, unknown_model
		"kvgate_globalrouter_tokenize_duration_seconds": 1,
		"kvgate_globalrouter_probe_duration_seconds":    2, // pool-a, pool-b
	} {
		got, err := testutil.GatherAndCount(reg, name)
		if err != nil {
			t.Fatal(err)
		}
		if got != n {
			t.Errorf("%s has %d series, want %d", name, got, n)
		}
	}
}
