package localrouter

import (
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/localrouter/signals"
)

// Calibration from the engines' own latency histograms (docs/localrouter.md,
// "Calibration"). Where a worker's metrics are scraped
// (localrouter/signals: vLLM's vllm:time_to_first_token_seconds, SGLang's
// sglang:time_to_first_token_seconds), each scrape gives, per rank, the
// first tokens the engine produced since the last one and their summed
// time to first token. The lifecycle's samples stay primary: the first
// tokens it saw in the interval (counted and summed as they come) are
// taken off, and only the remainder, first tokens the lifecycle did not
// see (its MarkPrefillComplete never came: a client that reads no stream,
// a global router that does not report it), becomes samples. Those are
// matched to the oldest placements on the rank still awaiting a sample
// (the engine schedules first come, first served, so its first tokens
// come about in placement order), including placements freed before a
// first token was reported; where the lifecycle reported first tokens on
// the rank in the interval, only those freed ones (the placements still
// pending will have theirs reported). The matched placements' summed features and
// the remainder's summed time (scaled to the matched count when fewer
// placements wait than first tokens came: load that bypassed the router)
// make one aggregate sample, the mean of m samples, which the fit weighs
// as m samples (the least-squares weight of a mean of m), at most
// calibHistMaxWeight.
//
// Interval deltas are reset-safe: totals that go down (the engine
// restarted) start a new baseline and give no sample; a failed scrape
// leaves the baseline, so the next delta spans both intervals.

// calibHistMaxWeight caps one scrape's aggregate at CalibrationMinSamples
// samples: matching first tokens to placements by order is approximate,
// so one interval never weighs more than the samples that establish a
// fit (a tenth of the fit's memory).
const calibHistMaxWeight = CalibrationMinSamples

// calibMaxUnsampled bounds, per rank, the placements freed before a first
// token was reported that wait for a histogram to match them.
const calibMaxUnsampled = 4096

// histState is one rank's histogram bookkeeping, under calibration.mu.
type histState struct {
	prev signals.Sample // the last scrape's totals (prev.TTFT.Has: a baseline)
	// lcCount and lcMs are the lifecycle's samples on the rank since the
	// last scrape (negative: a carry, first tokens the lifecycle saw
	// before the engine's histogram counted them).
	lcCount, lcMs float64
	// unsampled are placements freed before their first token was
	// reported, oldest first.
	unsampled []pendingSample
	// samples is the first tokens sampled from the histograms.
	samples uint64
	// means are the last interval's mean TTFT, ITL, queue, prefill and
	// decode times in ms (0: none observed).
	means [5]float64
}

// histFor returns rank k's state, creating it. Callers hold c.mu.
func (c *calibration) histFor(k WorkerKey) *histState {
	if c.hist == nil {
		c.hist = map[WorkerKey]*histState{}
	}
	h := c.hist[k]
	if h == nil {
		h = &histState{}
		c.hist[k] = h
	}
	return h
}

// lifecycleSeen counts a lifecycle sample of y ms on rank k against its
// engine's histogram. Callers hold c.mu.
func (c *calibration) lifecycleSeen(k WorkerKey, y float64) {
	if h := c.hist[k]; h != nil {
		h.lcCount++
		h.lcMs += y
	}
}

// keepUnsampled keeps a placement freed before its first token was
// reported for the rank's histogram, when the rank has one. Callers hold
// c.mu.
func (c *calibration) keepUnsampled(s pendingSample) {
	h := c.hist[s.key]
	if h == nil || !h.prev.TTFT.Has {
		return
	}
	if len(h.unsampled) >= calibMaxUnsampled {
		h.unsampled = h.unsampled[1:]
		c.dropped.Add(1)
	}
	h.unsampled = append(h.unsampled, s)
}

// engineLatency takes rank k's scraped sample smp: its latency
// histograms' interval means, and the time to first token of the first
// tokens the lifecycle did not see as one aggregate sample.
func (c *calibration) engineLatency(k WorkerKey, smp signals.Sample) {
	if !c.learn || !smp.TTFT.Has {
		return
	}
	c.mu.Lock()
	h := c.histFor(k)
	prev := h.prev
	h.prev = smp
	lcCount, lcMs := h.lcCount, h.lcMs
	h.lcCount, h.lcMs = 0, 0
	if !prev.TTFT.Has || smp.TTFT.Count < prev.TTFT.Count || smp.TTFT.Sum < prev.TTFT.Sum {
		c.mu.Unlock() // a first scrape, or the engine restarted: a new baseline
		return
	}
	for i, t := range [...][2]signals.HistogramTotals{{smp.TTFT, prev.TTFT}, {smp.ITL, prev.ITL}, {smp.Queue, prev.Queue}, {smp.Prefill, prev.Prefill}, {smp.Decode, prev.Decode}} {
		if mean, _, ok := t[0].Mean(t[1]); ok {
			h.means[i] = mean * 1000
		}
	}
	count := smp.TTFT.Count - prev.TTFT.Count - lcCount
	ms := (smp.TTFT.Sum-prev.TTFT.Sum)*1000 - lcMs
	if count < 1 || !(ms > 0) {
		// Nothing the lifecycle missed; a negative remainder is carried
		// (the lifecycle saw first tokens the engine counts next time).
		h.lcCount, h.lcMs = max(-count, 0), max(-ms, 0)
		c.mu.Unlock()
		return
	}
	// Where the lifecycle reported first tokens on the rank in the
	// interval, those still pending will have theirs: only placements
	// freed without one are matched (the remainder is then load that
	// bypassed the router, or a first token the lifecycle reports next).
	batch := c.oldestUnsampled(k, h, int(count), smp.At, lcCount > 0)
	m := float64(len(batch))
	if m == 0 {
		c.mu.Unlock()
		return
	}
	h.samples += uint64(m)
	w := c.fitFor(k)
	c.mu.Unlock()
	var x [calibParams]float64
	var scale float64
	for _, s := range batch {
		for i := range x {
			x[i] += s.x[i] / m
		}
		scale += s.scale / m
	}
	c.apply(w, x, ms/count, scale, min(m, calibHistMaxWeight))
}

// oldestUnsampled takes up to n of rank k's placements awaiting a sample
// (freed ones first: they are older than any still pending; with
// freedOnly, only those), placed before at. Callers hold c.mu.
func (c *calibration) oldestUnsampled(k WorkerKey, h *histState, n int, at time.Time, freedOnly bool) []pendingSample {
	take := min(n, len(h.unsampled))
	out := slices.Clone(h.unsampled[:take])
	h.unsampled = h.unsampled[take:]
	if len(out) == n || freedOnly {
		return out
	}
	var ids []string
	for id, s := range c.pending {
		if s.key == k && !s.start.After(at) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b string) int { // by placement, then id: deterministic
		if o := c.pending[a].start.Compare(c.pending[b].start); o != 0 {
			return o
		}
		return strings.Compare(a, b)
	})
	for _, id := range ids[:min(n-len(out), len(ids))] {
		out = append(out, c.pending[id])
		delete(c.pending, id)
	}
	return out
}

// histReport fills rank k's histogram side of its report.
func (c *calibration) histReport(k WorkerKey, out *WorkerCalibration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.hist[k]
	if h == nil {
		return
	}
	out.HistogramSamples = h.samples
	out.EngineTTFTMs, out.EngineITLMs, out.EngineQueueMs, out.EnginePrefillMs, out.EngineDecodeMs = h.means[0], h.means[1], h.means[2], h.means[3], h.means[4]
	if out.EngineTTFTMs == 0 && !h.prev.TTFT.Has {
		return
	}
	out.Histograms = true
}
