package globalrouter

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the global router's Prometheus metrics.
type metrics struct {
	decision  *prometheus.HistogramVec // outcome
	tokenize  prometheus.Histogram
	probe     *prometheus.HistogramVec // pool, outcome
	decisions *prometheus.CounterVec   // pool, outcome
	reloads   *prometheus.CounterVec   // result
	// refusedCommits counts commits local routers refused, by pool.
	refusedCommits *prometheus.CounterVec
	// contended counts decide-and-commits placed again under the recheck
	// lock (commit.go), by pool and outcome.
	contended *prometheus.CounterVec
	// bestEffort counts decisions made on the last known state, by pool.
	bestEffort *prometheus.CounterVec
	// bestEffortOutcomes counts what became of the decisions that found
	// no router at first, by pool and outcome (accounting.go).
	bestEffortOutcomes *prometheus.CounterVec
	// ejections counts passive-health ejections of workers, by pool.
	ejections *prometheus.CounterVec
	// reservationsReleased counts the probes' reservations released
	// unconfirmed (probe.commit: reserve; reserve.go), by pool.
	reservationsReleased *prometheus.CounterVec
	// reprobes counts the contended reserving decisions probed again
	// under the recheck lock (reserve.go), by outcome.
	reprobes *prometheus.CounterVec
	// unreadHeaders counts requests carrying a header the configuration
	// does not read, by header (unreadhdr.go: four names at most).
	unreadHeaders *prometheus.CounterVec
}

// Latency buckets from 50 µs (an in-process decision) to the probe
// deadline and beyond.
var latencyBuckets = []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 250e-3, 1}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decision: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_globalrouter_decision_duration_seconds",
			Help:    "Time to decide one request (tokenize, hash, probe, policies, commit), by outcome.",
			Buckets: latencyBuckets,
		}, []string{"outcome"}),
		tokenize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_globalrouter_tokenize_duration_seconds",
			Help:    "Time to tokenize one request's prompt.",
			Buckets: latencyBuckets,
		}),
		probe: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_globalrouter_probe_duration_seconds",
			Help:    "Time of one pool probe (state-free BestWorker), by pool and outcome (ok, error, timeout, starved: the deadline fired late because the global router was starved of CPU, circuit_open).",
			Buckets: latencyBuckets,
		}, []string{"pool", "outcome"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_decisions_total",
			Help: "Decisions, one per request, by chosen pool (empty when none) and outcome (a request waiting in the flow-control queue counts once, by how it left it; its tries are kvgate_flowcontrol_tries_total).",
		}, []string{"pool", "outcome"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_config_reloads_total",
			Help: "Configuration reloads, by result (ok, refused).",
		}, []string{"result"}),
		refusedCommits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_refused_commits_total",
			Help: "Commits a local router refused, by pool: before the decision (the next candidate was tried) or after it (pipelined; the request went to the probed worker unaccounted).",
		}, []string{"pool"}),
		contended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_contended_commits_total",
			Help: "Decide-and-commits whose answer was costlier than their probe (the pool got busier under the decision), placed again under the router's recheck lock, by pool and outcome (kept: stayed on the pool; moved: the recheck moved the request to another pool; refused: placing it again failed; busy: the recheck lock was not free within the probe timeout, the first placement stands).",
		}, []string{"pool", "outcome"}),
		bestEffort: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_best_effort_total",
			Help: "Decisions made on the last known state because no local router of any eligible pool could be reached, by pool: the request's commit is queued for its worker's router (kvgate_globalrouter_best_effort_outcomes_total says what became of it).",
		}, []string{"pool"}),
		bestEffortOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_best_effort_outcomes_total",
			Help: "What became of the decisions whose first probe reached no local router, by pool and outcome: retried_ok (the probe's one retry reached a router: an ordinary, accounted decision), and for the best-effort decisions, whose commit waits for a router of the pool to answer again: late_committed (a router recorded it), ended (the request ended before any router answered: nothing to account), refused (the router refused the commit), dropped (the pool's late-commit queue was full or the pool closed: the request ran unaccounted).",
		}, []string{"pool", "outcome"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_worker_ejections_total",
			Help: "Connection failures to workers reported by the response path (passive health), by pool.",
		}, []string{"pool"}),
		reservationsReleased: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_reservations_released_total",
			Help: "Reservations of reserving probes (probe.commit: reserve) released unconfirmed because the decision went to another pool or to none (or their probe's answer came too late), by the pool that held them (its local router counts the ones that expired instead).",
		}, []string{"pool"}),
		reprobes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_reserve_reprobes_total",
			Help: "Decisions in probe.commit: reserve over several pools whose probes found other requests' reservations held (contended: those may be released where they were counted), their reservations released and the pools probed again under the router's recheck lock, by outcome (locked; busy: the lock was not free within the probe timeout, probed again without it).",
		}, []string{"outcome"}),
		unreadHeaders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_globalrouter_unread_headers_total",
			Help: "Requests carrying a header the running configuration does not read (x-kvgate-priority, x-kvgate-ttft-ms, x-kvgate-itl-ms, x-kvgate-session-id: read by some policies or flow control only), by header; the decision's explanation says why.",
		}, []string{"header"}),
	}
	for _, c := range []prometheus.Collector{m.decision, m.tokenize, m.probe, m.decisions, m.reloads, m.refusedCommits, m.contended, m.bestEffort, m.bestEffortOutcomes, m.ejections, m.reservationsReleased, m.reprobes, m.unreadHeaders} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
