package flowcontrol

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// OtherFlow is the flow label of the tenants past Config.MaxFlowLabels
// (and of untenanted requests: "none").
const (
	OtherFlow = "other"
	NoFlow    = "none"
)

// Metrics are the queues' Prometheus metrics (one set for every queue of
// a router, by queue: the pools a queue's models are served by). Nil is
// valid and counts nothing.
type Metrics struct {
	depth      *prometheus.GaugeVec     // queue, band, flow
	bytes      *prometheus.GaugeVec     // queue, band
	wait       *prometheus.HistogramVec // queue, band, outcome
	dispatches *prometheus.CounterVec   // queue, band
	refusals   *prometheus.CounterVec   // queue, band, reason
	tries      *prometheus.CounterVec   // queue, band, outcome

	queue string
	// flows names the tenants with a label of their own, at most max.
	mu    *sync.Mutex
	flows map[string]bool
	max   int
}

// Wait buckets: a decode step (10 ms) to the default deadline and past.
var waitBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// NewMetrics registers the flow-control metrics on reg; maxFlows caps the
// tenants named in the flow label.
func NewMetrics(reg prometheus.Registerer, maxFlows int) (*Metrics, error) {
	m := &Metrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_flowcontrol_queue_depth_requests",
			Help: "Requests waiting for a saturated pool, by queue (the pools of its models), band and flow (tenant; past max_flow_labels tenants: other; untenanted: none).",
		}, []string{"queue", "band", "flow"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_flowcontrol_queue_bytes",
			Help: "Body bytes of the requests waiting, by queue and band.",
		}, []string{"queue", "band"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_flowcontrol_wait_duration_seconds",
			Help:    "Time requests waited in the queue, by queue, band and outcome (dispatched, deadline, cancelled: the client left, failed: the decision at dispatch failed, closed).",
			Buckets: waitBuckets,
		}, []string{"queue", "band", "outcome"}),
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_flowcontrol_dispatches_total",
			Help: "Queued requests sent on when a pool left saturation, by queue and band.",
		}, []string{"queue", "band"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_flowcontrol_refusals_total",
			Help: "Requests refused by flow control (429 with retry-after), by queue, band and reason (queue_full, queue_deadline, queue_late, queue_closed).",
		}, []string{"queue", "band", "reason"}),
		tries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_flowcontrol_tries_total",
			Help: "Decisions tried for requests waiting in the queue (each probes the pools again; the request's own decision is counted once, in kvgate_globalrouter_decisions_total), by queue, band and outcome (saturated: still saturated, it waits on; dispatched; late: refused, it would miss its deadline; failed: the decision failed otherwise; cancelled: the client left during the try).",
		}, []string{"queue", "band", "outcome"}),
		mu: &sync.Mutex{}, flows: map[string]bool{}, max: maxFlows,
	}
	for _, c := range []prometheus.Collector{m.depth, m.bytes, m.wait, m.dispatches, m.refusals, m.tries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// For returns the metrics labelled with queue name.
func (m *Metrics) For(queue string) *Metrics {
	if m == nil {
		return nil
	}
	c := *m
	c.queue = queue
	return &c
}

// flow is the flow label of tenant.
func (m *Metrics) flow(tenant string) string {
	if tenant == "" {
		return NoFlow
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.flows[tenant] {
		return tenant
	}
	if len(m.flows) < m.max {
		m.flows[tenant] = true
		return tenant
	}
	return OtherFlow
}

func (m *Metrics) enqueued(t *Ticket) {
	if m == nil {
		return
	}
	m.depth.WithLabelValues(m.queue, t.Band(), m.flow(t.Flow)).Inc()
	m.bytes.WithLabelValues(m.queue, t.Band()).Add(float64(t.Bytes))
}

// left counts t out of the queue, by outcome.
func (m *Metrics) left(t *Ticket, outcome string, now time.Time) {
	if m == nil {
		return
	}
	m.depth.WithLabelValues(m.queue, t.Band(), m.flow(t.Flow)).Dec()
	m.bytes.WithLabelValues(m.queue, t.Band()).Sub(float64(t.Bytes))
	m.wait.WithLabelValues(m.queue, t.Band(), outcome).Observe(now.Sub(t.Enqueued).Seconds())
	if outcome == "dispatched" {
		m.dispatches.WithLabelValues(m.queue, t.Band()).Inc()
	}
}

func (m *Metrics) refused(band, reason string) {
	if m == nil {
		return
	}
	m.refusals.WithLabelValues(m.queue, band, reason).Inc()
}

// tried counts one try of a waiting request's decision, by outcome.
func (m *Metrics) tried(band, outcome string) {
	if m == nil {
		return
	}
	m.tries.WithLabelValues(m.queue, band, outcome).Inc()
}
