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
//
// The latency histograms have vLLM's bucket layouts
// (vllm/v1/metrics/loggers.py at 005a810bc40faa25b8870fbc8559c3462581eee3):
// time to first token and the inter-token latency are observed per token,
// as vLLM's iteration stats do (time_to_first_tokens_iter,
// time_per_output_tokens_iter), so a scraper taking interval deltas sees a
// first token in the interval it happened in; queue, prefill, decode and
// end-to-end times per finished request (finished_requests). The
// inter-token latency is exported under both names vLLM has used for it:
// vllm:time_per_output_token_seconds (that commit's) and
// vllm:inter_token_latency_seconds (later releases', which emit both).
type serverMetrics struct {
	ttft       *prometheus.HistogramVec
	itl        *prometheus.HistogramVec
	tpot       *prometheus.HistogramVec
	queue      *prometheus.HistogramVec
	prefill    *prometheus.HistogramVec
	decode     *prometheus.HistogramVec
	e2e        *prometheus.HistogramVec
	prompt     *prometheus.CounterVec
	generation *prometheus.CounterVec
	finished   *prometheus.CounterVec
	sinkErrors prometheus.Counter
}

func newServerMetrics(reg prometheus.Registerer, model string, ranks []*live) *serverMetrics {
	labels := prometheus.Labels{"model_name": model}
	engine := []string{"engine"}
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets}, engine)
	}
	m := &serverMetrics{
		ttft: hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:  hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tokenBuckets),
		tpot: hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", tokenBuckets),
		queue: hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
			requestBuckets),
		prefill: hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
			requestBuckets),
		decode: hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
			requestBuckets),
		e2e: hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestBuckets),
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
	reg.MustRegister(m.ttft, m.itl, m.tpot, m.queue, m.prefill, m.decode, m.e2e, m.prompt, m.generation, m.finished, m.sinkErrors)
	for r, l := range ranks {
		rl := prometheus.Labels{"model_name": model, "engine": strconv.Itoa(r)}
		l.rank = strconv.Itoa(r)
		// Present from the start, at 0, as vLLM's make_per_engine does.
		m.prompt.WithLabelValues(l.rank)
		m.generation.WithLabelValues(l.rank)
		for _, h := range []*prometheus.HistogramVec{m.ttft, m.itl, m.tpot, m.queue, m.prefill, m.decode, m.e2e} {
			h.WithLabelValues(l.rank)
		}
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

// vLLM's bucket layouts (loggers.py at 005a810b): the time to first
// token's, the per-token latency's (time_per_output_token, later also
// inter_token_latency) and the per-request phases' (request_latency_buckets:
// e2e, queue, prefill, decode).
var (
	ttftBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	tokenBuckets   = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	requestBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// token records a token of rank as it is produced: the first one's time
// to first token, the others' inter-token latency; called with live.mu
// held.
func (m *serverMetrics) token(rank string, t Token) {
	if t.Since <= 0 {
		return
	}
	if t.Index == 0 {
		m.ttft.WithLabelValues(rank).Observe(t.Since.Seconds())
		return
	}
	m.itl.WithLabelValues(rank).Observe(t.Since.Seconds())
	m.tpot.WithLabelValues(rank).Observe(t.Since.Seconds())
}

// observe records a finished request of rank; called with live.mu held.
func (m *serverMetrics) observe(rank string, c Completion) {
	if c.Reason == FinishAbort {
		return
	}
	m.e2e.WithLabelValues(rank).Observe(c.Finished.Sub(c.Arrival).Seconds())
	if !c.Scheduled.IsZero() {
		m.queue.WithLabelValues(rank).Observe(c.Scheduled.Sub(c.Arrival).Seconds())
		if !c.FirstToken.IsZero() {
			m.prefill.WithLabelValues(rank).Observe(c.FirstToken.Sub(c.Scheduled).Seconds())
			m.decode.WithLabelValues(rank).Observe(c.Finished.Sub(c.FirstToken).Seconds())
		}
	}
	m.prompt.WithLabelValues(rank).Add(float64(c.PromptTokens - c.CachedTokens))
	m.generation.WithLabelValues(rank).Add(float64(c.OutputTokens))
	m.finished.WithLabelValues(rank, c.Reason).Inc()
}
