package mocker

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// serverMetrics are exposed under vLLM's names and label sets
// (vllm/v1/metrics/loggers.py, PrometheusStatLogger: labels model_name and
// engine, the engine index being the data-parallel rank), so dashboards
// and scrapers made for vLLM (kvgate's own local routers, the Gateway API
// Inference Extension's metrics-based scorers) work unchanged against the
// mocker. That is the one place kvgate departs from its
// kvgate_<component>_… naming.
type serverMetrics struct {
	ttft       *prometheus.HistogramVec
	e2e        *prometheus.HistogramVec
	prompt     *prometheus.CounterVec
	generation *prometheus.CounterVec
	finished   *prometheus.CounterVec
	sinkErrors prometheus.Counter
}

func newServerMetrics(reg prometheus.Registerer, model string, ranks []*live) *serverMetrics {
	labels := prometheus.Labels{"model_name": model}
	engine := []string{"engine"}
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	m := &serverMetrics{
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vllm:time_to_first_token_seconds", Help: "Histogram of time to first token in seconds.",
			ConstLabels: labels, Buckets: latency,
		}, engine),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vllm:e2e_request_latency_seconds", Help: "Histogram of end to end request latency in seconds.",
			ConstLabels: labels, Buckets: latency,
		}, engine),
		prompt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:prompt_tokens_total", Help: "Number of prefill tokens processed.", ConstLabels: labels,
		}, engine),
		generation: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:generation_tokens_total", Help: "Number of generation tokens processed.", ConstLabels: labels,
		}, engine),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
		}, []string{"engine", "finished_reason"}),
		sinkErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_mocker_kv_publish_errors_total", Help: "KV event batches the mocker failed to publish.",
		}),
	}
	reg.MustRegister(m.ttft, m.e2e, m.prompt, m.generation, m.finished, m.sinkErrors)
	for r, l := range ranks {
		rl := prometheus.Labels{"model_name": model, "engine": strconv.Itoa(r)}
		l.rank = strconv.Itoa(r)
		// Present from the start, at 0, as vLLM's make_per_engine does.
		m.prompt.WithLabelValues(l.rank)
		m.generation.WithLabelValues(l.rank)
		gauge := func(name, help string, f func(Stats) float64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: rl},
				func() float64 { return f(l.stats()) })
		}
		counter := func(name, help string, f func(Stats) float64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: rl},
				func() float64 { return f(l.stats()) })
		}
		reg.MustRegister(
			gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
				func(s Stats) float64 { return float64(s.Running) }),
			gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
				func(s Stats) float64 { return float64(s.Waiting) }),
			gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
				func(s Stats) float64 { return s.KVUsage }),
			counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
				func(s Stats) float64 { return float64(s.PrefixQueryTokens) }),
			counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
				func(s Stats) float64 { return float64(s.PrefixHitTokens) }),
			counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
				func(s Stats) float64 { return float64(s.Preemptions) }),
		)
	}
	return m
}

// observe records a finished request of rank; called with live.mu held.
func (m *serverMetrics) observe(rank string, c Completion) {
	if c.Reason == FinishAbort {
		return
	}
	if ttft := c.TTFT(); ttft > 0 {
		m.ttft.WithLabelValues(rank).Observe(ttft.Seconds())
	}
	m.e2e.WithLabelValues(rank).Observe(c.Finished.Sub(c.Arrival).Seconds())
	m.prompt.WithLabelValues(rank).Add(float64(c.PromptTokens - c.CachedTokens))
	m.generation.WithLabelValues(rank).Add(float64(c.OutputTokens))
	m.finished.WithLabelValues(rank, c.Reason).Inc()
}
