package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a Run.
type Report struct {
	Trace     string  `json:"trace"`
	Requests  int     `json:"requests"`
	Skipped   int     `json:"skipped_lines"`
	Rate      float64 `json:"rate"`
	Workers   int     `json:"workers"`
	BlockSize int     `json:"block_size"`
	KVTokens  int     `json:"kv_tokens_per_worker"`
	Seed      uint64  `json:"seed"`
	// EventDelayMS is the KV event delay between workers and routers.
	EventDelayMS float64 `json:"event_delay_ms"`
	// PredictedTTLMS is the routers' predicted-entry TTL (0: none).
	PredictedTTLMS float64 `json:"predicted_ttl_ms"`
	// OracleHitRatio is the hit ratio of an infinite shared cache.
	OracleHitRatio float64 `json:"oracle_hit_ratio"`
	// CapacityOracleHitRatio is the hit ratio of one LRU cache holding the
	// pool's total KV capacity (workers × KV tokens per worker) serving
	// every request: perfect routing without duplication.
	CapacityOracleHitRatio float64 `json:"capacity_oracle_hit_ratio"`
	// UnloadedTTFTMS is the TTFT of each request alone on an idle worker
	// with a cold cache: the floor a loaded system is compared with.
	UnloadedTTFTMS Dist `json:"unloaded_ttft_ms"`
	// Load is --load: the offered rate as a multiple of Capacity, the
	// pools' measured capacity (calibrate.go); Rate is the multiplier of
	// the trace's arrivals it came to.
	Load     float64   `json:"load,omitempty"`
	Capacity *Capacity `json:"capacity,omitempty"`
	// WarmupRequests is the number of first requests (by arrival) left out
	// of every result's TTFT figures (ttft_ms): the first WarmupFraction
	// of the trace, while caches fill and the routers' calibration learns.
	WarmupRequests int       `json:"ttft_warmup_requests"`
	Results        []*Result `json:"results"`
	// classes: WriteTable prints the figures by priority and tenant.
	classes bool
	Replay  ReplayStats `json:"replay"`

	// Engines is the engine profile (engine.go); Bounds more oracles
	// (oracle_causal.go).
	Engines EngineReport `json:"engines"`
	Bounds  OracleBounds `json:"bounds"`
}

// ReplayStats describe the replay itself, not the simulated system.
type ReplayStats struct {
	WallSeconds           float64 `json:"wall_seconds"`
	SimulatedRequests     int     `json:"simulated_requests"`
	RequestsPerWallSecond float64 `json:"requests_per_wall_second"`
	HeapSysBytes          uint64  `json:"heap_sys_bytes"`
	// PeakRSSBytes is the process's peak resident set (Linux; 0 elsewhere).
	PeakRSSBytes uint64 `json:"peak_rss_bytes"`
}

// Dist summarises a distribution.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Result is one (topology, policy) simulation.
type Result struct {
	Topology  string `json:"topology"`
	Policy    string `json:"policy"`
	Completed int    `json:"completed"`
	// Rejected requests could never fit in a worker's KV cache, or (a
	// config replay) were refused by Decide: DecideRejected counts those
	// by cause (saturated, no_pool, unknown_model, forbidden, ...).
	Rejected       int            `json:"rejected"`
	DecideRejected map[string]int `json:"decide_rejected,omitempty"`
	TTFTMS         Dist           `json:"ttft_ms"`
	// ITLMS is the mean inter-token latency of each request with more
	// than one output token.
	ITLMS Dist `json:"itl_ms"`
	E2EMS Dist `json:"e2e_ms"`
	// Throughput over the makespan (first arrival to last token).
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	// HitRatio is prompt tokens served from cache / prompt tokens.
	HitRatio    float64 `json:"hit_ratio"`
	HitVsOracle float64 `json:"hit_vs_oracle"`
	// HitVsCapacityOracle is HitRatio over the capacity oracle's.
	HitVsCapacityOracle float64 `json:"hit_vs_capacity_oracle"`
	// LoadImbalance is the busiest worker's busy time over the mean (the
	// worst pool's, when pools have roles).
	LoadImbalance  float64   `json:"load_imbalance"`
	BusySeconds    []float64 `json:"worker_busy_seconds"`
	Preemptions    int       `json:"preemptions"`
	EventsRejected int       `json:"kv_events_rejected"`
	// SLOMS is each priority's TTFT target (--slo-ms, or the defaults of
	// mix.go); SLOMetRatio the share of all offered requests served
	// within theirs; GoodputRPS those requests per second of the offered
	// window (first to last arrival).
	SLOMS       map[string]float64 `json:"slo_ms"`
	SLOMetRatio float64            `json:"slo_met_ratio"`
	GoodputRPS  float64            `json:"goodput_rps"`
	// ByPriority and ByTenant break the figures down by the priority and
	// the tenant requests carried (ByTenant with --tenant-mix only).
	ByPriority map[string]*ClassFigures `json:"by_priority"`
	ByTenant   map[string]*ClassFigures `json:"by_tenant,omitempty"`
	// JainFairness is Jain's index over the tenants' served share of their
	// own demand (completed / offered; mix.go JainIndex), with
	// --tenant-mix.
	JainFairness *float64 `json:"jain_fairness,omitempty"`
	// JainMaxMin is Jain's index over the tenants' served requests
	// normalised by their max-min fair share of all that was served
	// (MaxMinShares: the water-filling of the served total over the
	// tenants' demands), Jain's own normalisation (throughput over the
	// fair allocation): 1 when each tenant got its max-min share, which
	// round robin between tenants aims at. With --tenant-mix.
	JainMaxMin *float64 `json:"jain_fairness_max_min,omitempty"`

	// ttfts are the sorted TTFTs in ms, for plots.
	ttfts []float64
	// workers is the index of the worker that prefilled each request (-1
	// if rejected), for tests.
	workers []int
	// finishes are the completed requests' last tokens, from the first
	// arrival, sorted (Calibrate).
	finishes []time.Duration
}

// Label names the result in tables and plots.
func (r *Result) Label() string { return r.Topology + "/" + r.Policy }

// WarmupFraction is the share of a trace's first requests (by arrival)
// left out of the TTFT figures: caches start empty and online calibration
// (localrouter.CalibrationMinSamples samples per worker) still uses the
// configured curves, so the first requests measure the start, not the
// policy. Hit ratio, throughput, ITL and E2E count every request.
const WarmupFraction = 0.1

// warmup is the number of requests of n left out of the TTFT figures.
func warmup(n int) int { return int(float64(n) * WarmupFraction) }

func newReport(cfg Config, wl *workload) *Report {
	workers := cfg.Workers
	if cfg.Global != nil {
		workers = cfg.Global.totalWorkers(cfg.Workers)
	}
	rep := &Report{
		Trace: cfg.TraceName, Requests: len(wl.reqs), Skipped: len(cfg.Trace.Skipped), Rate: cfg.Rate,
		Workers: workers, BlockSize: cfg.BlockSize, KVTokens: cfg.KVTokens, Seed: cfg.Seed,
		EventDelayMS:   ms(cfg.EventDelay),
		PredictedTTLMS: ms(max(0, cfg.routerConfig().PredictedTTL)),
		OracleHitRatio: oracleHitRatio(wl),
		WarmupRequests: warmup(len(wl.reqs)),
	}
	rep.CapacityOracleHitRatio = capacityOracleHitRatio(wl, workers*(cfg.KVTokens/cfg.BlockSize))
	// The floor: the fastest engine of the profile, alone and idle.
	timing := cfg.fastestTiming()
	var un []float64
	for _, r := range wl.reqs {
		un = append(un, ms(unloadedTTFT(r.InputLength, cfg.MaxNumBatchedTokens, timing)))
	}
	rep.UnloadedTTFTMS = dist(un)
	return rep
}

func (r *run) result() *Result {
	res := &Result{Topology: r.topo.Name(), Policy: r.policy.Name, EventsRejected: r.eventsRejected}
	if len(r.decideErrors) > 0 {
		res.DecideRejected = maps.Clone(r.decideErrors)
	}
	var ttft, itl, e2e []float64
	var prompt, cached, out int64
	var first, last time.Time
	res.workers = make([]int, len(r.recs))
	warm := warmup(len(r.recs))
	for i, rec := range r.recs {
		if first.IsZero() || rec.arrival.Before(first) {
			first = rec.arrival
		}
		res.workers[i] = rec.worker
		if rec.rejected {
			res.workers[i] = -1
			res.Rejected++
			continue
		}
		res.Completed++
		res.Preemptions += rec.preemptions
		if i >= warm {
			ttft = append(ttft, ms(rec.first.Sub(rec.arrival)))
		}
		e2e = append(e2e, ms(rec.finish.Sub(rec.arrival)))
		if rec.output > 1 {
			itl = append(itl, ms(rec.finish.Sub(rec.first))/float64(rec.output-1))
		}
		prompt += int64(rec.prompt)
		cached += int64(rec.cached)
		out += int64(rec.output)
		if rec.finish.After(last) {
			last = rec.finish
		}
		res.finishes = append(res.finishes, rec.finish.Sub(epoch))
	}
	slices.Sort(res.finishes)
	if r.cfg.SLOMS != nil {
		r.classify(res)
	}
	res.TTFTMS, res.ITLMS, res.E2EMS = dist(ttft), dist(itl), dist(e2e)
	slices.Sort(ttft)
	res.ttfts = ttft
	if span := last.Sub(first).Seconds(); span > 0 {
		res.OutputTokensPerS = float64(out) / span
		res.RequestsPerS = float64(res.Completed) / span
	}
	res.HitRatio = ratio(float64(cached), float64(prompt))
	for _, p := range r.pools {
		var sum, most float64
		for _, w := range p.workers {
			s := w.busy.Seconds()
			res.BusySeconds = append(res.BusySeconds, s)
			sum += s
			most = max(most, s)
		}
		res.LoadImbalance = max(res.LoadImbalance, ratio(most, sum/float64(len(p.workers))))
	}
	return res
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// dist summarises xs (nearest-rank percentiles).
func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Dist{Mean: sum / float64(len(s)), P50: q(0.50), P90: q(0.90), P99: q(0.99)}
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteTable writes the report as a terminal table.
func (rep *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "trace %s: %d requests (%d malformed lines skipped), rate %gx, %d workers, block %d, %d KV tokens/worker, seed %d, event delay %gms, predicted TTL %gms\n",
		orDash(rep.Trace), rep.Requests, rep.Skipped, rep.Rate, rep.Workers, rep.BlockSize, rep.KVTokens, rep.Seed, rep.EventDelayMS, rep.PredictedTTLMS)
	fmt.Fprintf(w, "oracle hit ratio %.3f (infinite cache), capacity oracle %.3f (one LRU cache of the pool's KV capacity); unloaded TTFT (idle worker, cold cache) mean %.0f p50 %.0f p99 %.0f ms\n",
		rep.OracleHitRatio, rep.CapacityOracleHitRatio, rep.UnloadedTTFTMS.Mean, rep.UnloadedTTFTMS.P50, rep.UnloadedTTFTMS.P99)
	if c := rep.Capacity; c != nil {
		fmt.Fprintf(w, "capacity %.2f requests/s (a backlog of %d of the trace's requests at once, %d refused, 10th to 90th percentile completion over %.1fs); load %gx: %.2f requests/s offered, the trace's %.3f requests/s × %.3g\n",
			c.RPS, c.Requests, c.Refused, c.WindowSeconds, rep.Load, rep.Load*c.RPS, c.TraceRPS, rep.Rate)
	}
	fmt.Fprintf(w, "TTFT columns leave out a warm-up: the first %d requests (%.0f %%); every other column counts all\n\n", rep.WarmupRequests, 100*WarmupFraction)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "topology\tpolicy\tTTFT mean\tp50\tp90\tp99 ms\tITL ms\tE2E mean\tp99 s\ttok/s\thit\t/oracle\t/capacity\timbalance\tpreempt\trejected\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.2f\t%.2f\t%.0f\t%.3f\t%.3f\t%.3f\t%.2f\t%d\t%d\t\n",
			r.Topology, r.Policy, f0(r.TTFTMS.Mean), f0(r.TTFTMS.P50), f0(r.TTFTMS.P90), f0(r.TTFTMS.P99),
			r.ITLMS.Mean, r.E2EMS.Mean/1000, r.E2EMS.P99/1000, r.OutputTokensPerS,
			r.HitRatio, r.HitVsOracle, r.HitVsCapacityOracle, r.LoadImbalance, r.Preemptions, r.Rejected)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := rep.writeClasses(w); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nreplay: %d simulated requests in %.1fs wall (%.0f requests/s), peak RSS %s\n",
		rep.Replay.SimulatedRequests, rep.Replay.WallSeconds, rep.Replay.RequestsPerWallSecond, mib(rep.Replay.PeakRSSBytes))
	return err
}

func f0(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func mib(b uint64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}

// peakRSS reads the process's peak resident set size (VmHWM) on Linux.
func peakRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
