package extproc

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus collectors, registered on the
// registry the caller injects.
type metrics struct {
	requests *prometheus.CounterVec
	decision prometheus.Histogram
	overlap  *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	streams  prometheus.Gauge
	refused  *prometheus.CounterVec
}

// Label values of kvgate_extproc_requests_total's code beside HTTP
// statuses: the stream ended before response headers (the client went
// away, or Envoy answered with a local reply it does not show ext_proc).
const codeClientClosed = "499"

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_extproc_requests_total",
			Help: "Inference requests by the pool that served them (empty when none was chosen) and HTTP status (499: the stream ended before response headers: client gone, or Envoy answered itself).",
		}, []string{"pool", "code"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_extproc_decision_duration_seconds",
			Help:    "Time from a complete request body to the routing decision (parse, tokenize, probe, policies, commit).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		overlap: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_extproc_overlap_blocks",
			Help:    "KV blocks of the prompt already cached on the chosen worker.",
			Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
		}, []string{"pool"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_extproc_tokens_total",
			Help: "Tokens reported in responses' usage, by pool and kind (prompt, completion).",
		}, []string{"pool", "kind"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_extproc_streams_active",
			Help: "ext_proc streams currently open.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.decision, m.overlap, m.tokens, m.streams} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	var err error
	if m.refused, err = newRefusedCounter(reg); err != nil {
		return nil, err
	}
	return m, nil
}
