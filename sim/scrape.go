package sim

import (
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/signals"
)

// The engines' metrics, as a local router's scraper sees them
// (localrouter/signals.Scraper → Router.SetEngineSignals): every scrape
// period each engine's running and waiting requests and KV usage are
// sampled, as vLLM's vllm:num_requests_running, vllm:num_requests_waiting
// and vllm:kv_cache_usage_perc gauges report them, with its time to first
// token histogram's totals (vllm:time_to_first_token_seconds' _sum and
// _count, observed at each first token as vLLM does), and reach its
// pool's router ScrapeDelay later. Worker chains that read engine signals
// (saturation, waiting, kv-usage, running, the ttft scorer's KV usage)
// and the llm-d baseline (llmd.go) see exactly that: values up to one
// period plus the delay old, never the engine's live state.

// startScrapes schedules the first scrape at virtual time zero, when the
// profile scrapes at all.
func (r *run) startScrapes() {
	if r.cfg.Engines.scrapePeriod() <= 0 || len(r.workers) == 0 {
		return
	}
	r.scrapeQueued++
	r.push(event{t: epoch, kind: evScrape})
}

// scrape samples every engine and hands the samples to the routers, now
// or after the delay, then schedules the next scrape while anything else
// (an arrival, an engine iteration, a KV event) is still to happen.
func (r *run) scrape() {
	r.scrapeQueued--
	smp := make([]signals.Sample, len(r.workers))
	for i, w := range r.workers {
		st := w.eng.Stats()
		ttft := w.ttft
		ttft.Has = true // present from the start, as vLLM's are
		smp[i] = signals.Sample{
			Engine:  signals.EngineVLLM,
			Running: float64(st.Running), Waiting: float64(st.Waiting),
			KVUsage: st.KVUsage, HasKVUsage: true,
			TTFT: ttft, At: r.now,
		}
	}
	if d := r.cfg.Engines.ScrapeDelay; d > 0 {
		r.scrapeQueued++
		r.push(event{t: r.now.Add(d), kind: evSignals, samples: smp})
	} else {
		r.deliver(smp)
	}
	if r.q.Len() > r.scrapeQueued {
		r.scrapeQueued++
		r.push(event{t: r.now.Add(r.cfg.Engines.scrapePeriod()), kind: evScrape})
	}
}

// deliver sets each worker's engine signals on its router, as one
// scrape round does.
func (r *run) deliver(smp []signals.Sample) {
	for i, w := range r.workers {
		w.pool.router.SetEngineSignals(w.key.ID, map[uint32]signals.Sample{0: smp[i]})
	}
}

// delivered accounts for an evSignals event taken off the queue.
func (r *run) delivered(smp []signals.Sample) {
	r.scrapeQueued--
	r.deliver(smp)
}

// SignalReaders names the policies of c that read scraped engine signals:
// llm-d, kvgate's ttft scorer (the KV usage it takes over its own
// estimate) and worker chains with entries reading engine metrics
// (localrouter.EngineMetricEntries). A --config replay's chains are
// checked by the configuration's own tools, not here.
func (c Config) SignalReaders() []string {
	c = c.withDefaults()
	var out []string
	for _, p := range c.Policies {
		switch {
		case c.Global != nil:
		case p.Kind == KindLLMD, p.Kind == KindTTFT:
			out = append(out, p.Name)
		case p.Kind == KindCost && len(localrouter.EngineMetricEntries(p.routerConfig(c.BlockSize, c.PredictedTTL).WorkerChain)) > 0:
			out = append(out, p.Name)
		}
	}
	return out
}
