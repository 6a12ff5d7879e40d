// Package signals reads what inference engines say about themselves: a
// local router scrapes each worker's Prometheus metrics endpoint (vLLM's or
// SGLang's /metrics, or the mocker's, which uses vLLM's names) and turns
// the exposition into one Sample per data-parallel rank: requests running
// and waiting, KV cache usage, preemptions and the prefix cache hit rate.
// The router's cost function and saturation filter read those samples
// (localrouter.Router.SetEngineSignals), so load that bypasses kvgate,
// engine queues and preemptions are seen, not only the load kvgate routed.
//
// Parse is the parser of outside input (a worker's metrics body): bounded
// in bytes and in ranks, never a panic, an error for anything it cannot
// read. Scraper runs the periodic scrapes; a failure is counted and logged,
// never fatal, and clears the worker's samples so stale numbers never steer
// routing.
//
// The names read, verified against the engines' sources:
//
//   - vLLM (vllm/v1/metrics/loggers.py, PrometheusStatLogger; labels
//     model_name and engine, the engine index being the DP rank):
//     vllm:num_requests_running, vllm:num_requests_waiting,
//     vllm:kv_cache_usage_perc (older builds: vllm:gpu_cache_usage_perc),
//     vllm:num_preemptions_total, vllm:prefix_cache_queries_total and
//     vllm:prefix_cache_hits_total (older: vllm:gpu_prefix_cache_*).
//
//   - SGLang (python/sglang/srt/metrics/collector.py,
//     SchedulerMetricsCollector; a dp_rank label when DP attention is on,
//     python/sglang/srt/managers/scheduler_metrics_mixin.py):
//     sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage,
//     sglang:cache_hit_rate, sglang:num_retracted_reqs (its preemption).
//
//   - vLLM's LoRA adapters (vllm/v1/metrics/loggers.py, gauge_lora_info):
//     vllm:lora_requests_info, a gauge set to the current time whose labels
//     running_lora_adapters and waiting_lora_adapters are the adapters of
//     the running and waiting requests, comma-joined, and max_lora. It has
//     no engine label (vLLM refuses LoRA with more than one engine), so it
//     is rank 0's; of several series (old label sets linger until the
//     process exits) the one with the latest timestamp wins, as the Gateway
//     API Inference Extension reads it.
//
//   - The engines' latency histograms (their _sum and _count per rank, for
//     the local router's calibration): vLLM's
//     vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds
//     (older: vllm:time_per_output_token_seconds),
//     vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds
//     and vllm:request_decode_time_seconds (loggers.py at 005a810b);
//     SGLang's sglang:time_to_first_token_seconds,
//     sglang:inter_token_latency_seconds and sglang:queue_time_seconds
//     (collector.py at 93d04878; its tokenizer-side histograms carry no
//     dp_rank label, so they are read as rank 0's).
//
// Files: parse.go (Sample, Parse: the metric names above, per rank, the
// latency histograms and the LoRA adapters), scraper.go (Target, Sink, Scraper: the periodic
// scrapes, Stats).
package signals

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/api/routing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engines a Sample can come from.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

// DefaultMaxBytes bounds a metrics body (4 MiB; a vLLM endpoint with all
// its histograms is tens of KiB per rank).
const DefaultMaxBytes = 4 << 20

// MaxRanks bounds the distinct DP ranks one body may report.
const MaxRanks = 1024

// Errors of Parse.
var (
	// ErrTooLarge: the body exceeds the byte bound.
	ErrTooLarge = errors.New("metrics body too large")
	// ErrNoSignals: the body parsed but holds none of the known names (not
	// a vLLM or SGLang endpoint, or not yet serving).
	ErrNoSignals = errors.New("no engine signals in metrics body")
	// ErrMalformed wraps the text parser's errors and bad label values.
	ErrMalformed = errors.New("malformed metrics body")
)

// Sample is one DP rank's signals, as its engine last reported them
// (routing.EngineSample: the vocabulary both sides of the local-router API
// share).
type Sample = routing.EngineSample

// HistogramTotals are a latency histogram's cumulative sum and count
// (routing.HistogramTotals).
type HistogramTotals = routing.HistogramTotals

// Adapters splits a comma-joined adapter list (LoRARunning, LoRAWaiting).
func Adapters(list string) []string {
	var out []string
	for a := range strings.SplitSeq(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// loraMetric is vLLM's LoRA adapters gauge.
const loraMetric = "vllm:lora_requests_info"

// MaxLoRAAdapters bounds the adapters read from one label.
const MaxLoRAAdapters = 256

// metric names and what they set.
type field int

const (
	fRunning field = iota
	fWaiting
	fKVUsage
	fKVUsageOld
	fPreemptions
	fPrefixQueries
	fPrefixHits
	fPrefixQueriesOld
	fPrefixHitsOld
	fHitRate
	nFields
)

// latency histograms and what they set.
type hist int

const (
	hTTFT hist = iota
	hITL
	hITLOld
	hQueue
	hPrefill
	hDecode
	nHists
)

var histNames = map[string]struct {
	engine string
	h      hist
}{
	"vllm:time_to_first_token_seconds":   {EngineVLLM, hTTFT},
	"vllm:inter_token_latency_seconds":   {EngineVLLM, hITL},
	"vllm:time_per_output_token_seconds": {EngineVLLM, hITLOld},
	"vllm:request_queue_time_seconds":    {EngineVLLM, hQueue},
	"vllm:request_prefill_time_seconds":  {EngineVLLM, hPrefill},
	"vllm:request_decode_time_seconds":   {EngineVLLM, hDecode},
	"sglang:time_to_first_token_seconds": {EngineSGLang, hTTFT},
	"sglang:inter_token_latency_seconds": {EngineSGLang, hITL},
	"sglang:queue_time_seconds":          {EngineSGLang, hQueue},
}

var names = map[string]struct {
	engine string
	f      field
}{
	"vllm:num_requests_running":           {EngineVLLM, fRunning},
	"vllm:num_requests_waiting":           {EngineVLLM, fWaiting},
	"vllm:kv_cache_usage_perc":            {EngineVLLM, fKVUsage},
	"vllm:gpu_cache_usage_perc":           {EngineVLLM, fKVUsageOld},
	"vllm:num_preemptions_total":          {EngineVLLM, fPreemptions},
	"vllm:prefix_cache_queries_total":     {EngineVLLM, fPrefixQueries},
	"vllm:prefix_cache_hits_total":        {EngineVLLM, fPrefixHits},
	"vllm:gpu_prefix_cache_queries_total": {EngineVLLM, fPrefixQueriesOld},
	"vllm:gpu_prefix_cache_hits_total":    {EngineVLLM, fPrefixHitsOld},
	"sglang:num_running_reqs":             {EngineSGLang, fRunning},
	"sglang:num_queue_reqs":               {EngineSGLang, fWaiting},
	"sglang:token_usage":                  {EngineSGLang, fKVUsage},
	"sglang:num_retracted_reqs":           {EngineSGLang, fPreemptions},
	"sglang:cache_hit_rate":               {EngineSGLang, fHitRate},
}

// rankLabel is the label that carries the DP rank, per engine.
var rankLabel = map[string]string{EngineVLLM: "engine", EngineSGLang: "dp_rank"}

type acc struct {
	engine string
	v      [nFields]float64
	has    [nFields]bool
	hist   [nHists]routing.HistogramTotals
	// lora: the latest vllm:lora_requests_info series (loraAt its value).
	lora              bool
	loraAt            float64
	loraRun, loraWait string
	maxLoRA           int
}

// Parse reads a Prometheus text exposition of at most maxBytes bytes
// (DefaultMaxBytes when ≤ 0) and returns a Sample per DP rank, stamped
// with at. A series without a rank label is rank 0. Where one rank has
// several series of a name (SGLang's tp_rank, say) the largest value
// wins. Values that are NaN, infinite or negative are ignored. The error
// is ErrTooLarge, ErrMalformed (wrapped) or ErrNoSignals.
func Parse(r io.Reader, maxBytes int64, at time.Time) (map[uint32]Sample, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	lr := &io.LimitedReader{R: r, N: maxBytes + 1}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(lr)
	if lr.N <= 0 {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, maxBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	ranks := map[uint32]*acc{}
	for name, mf := range fams {
		if name == loraMetric {
			if err := readLoRA(mf, ranks); err != nil {
				return nil, err
			}
			continue
		}
		if hn, ok := histNames[name]; ok {
			if err := readHist(mf, hn.engine, hn.h, ranks); err != nil {
				return nil, err
			}
			continue
		}
		n, ok := names[name]
		if !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			v, ok := value(m)
			if !ok {
				continue
			}
			rank, err := rankOf(m, rankLabel[n.engine])
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, name, err)
			}
			a, err := accOf(ranks, rank, n.engine)
			if err != nil {
				return nil, err
			}
			if !a.has[n.f] || v > a.v[n.f] {
				a.v[n.f], a.has[n.f] = v, true
			}
		}
	}
	if len(ranks) == 0 {
		return nil, ErrNoSignals
	}
	out := make(map[uint32]Sample, len(ranks))
	for rank, a := range ranks {
		out[rank] = a.sample(at)
	}
	return out, nil
}

func (a *acc) sample(at time.Time) Sample {
	s := Sample{Engine: a.engine, At: at, Running: a.v[fRunning], Waiting: a.v[fWaiting], Preemptions: a.v[fPreemptions]}
	switch {
	case a.has[fKVUsage]:
		s.KVUsage, s.HasKVUsage = a.v[fKVUsage], true
	case a.has[fKVUsageOld]:
		s.KVUsage, s.HasKVUsage = a.v[fKVUsageOld], true
	}
	if s.KVUsage > 1 {
		s.KVUsage = 1
	}
	s.TTFT, s.Queue, s.Prefill, s.Decode = a.hist[hTTFT], a.hist[hQueue], a.hist[hPrefill], a.hist[hDecode]
	s.ITL = a.hist[hITL]
	if !s.ITL.Has {
		s.ITL = a.hist[hITLOld]
	}
	if a.lora {
		s.LoRARunning, s.LoRAWaiting, s.MaxLoRA, s.HasLoRA = a.loraRun, a.loraWait, a.maxLoRA, true
	}
	switch {
	case a.has[fHitRate]:
		s.PrefixHitRate, s.HasPrefixHitRate = min(a.v[fHitRate], 1), true
	case a.has[fPrefixQueries] || a.has[fPrefixHits]:
		s.PrefixHitRate, s.HasPrefixHitRate = ratio(a.v[fPrefixHits], a.v[fPrefixQueries]), true
	case a.has[fPrefixQueriesOld] || a.has[fPrefixHitsOld]:
		s.PrefixHitRate, s.HasPrefixHitRate = ratio(a.v[fPrefixHitsOld], a.v[fPrefixQueriesOld]), true
	}
	return s
}

func ratio(hits, queries float64) float64 {
	if queries <= 0 {
		return 0
	}
	return min(hits/queries, 1)
}

// value is a gauge's, counter's or untyped metric's value, if usable.
func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

func rankOf(m *dto.Metric, label string) (uint32, error) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() != label {
			continue
		}
		r, err := strconv.ParseUint(lp.GetValue(), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("label %s=%q is not a rank", label, lp.GetValue())
		}
		return uint32(r), nil
	}
	return 0, nil
}

// readLoRA reads vllm:lora_requests_info into rank 0's accumulator: the
// series with the latest timestamp wins.
func readLoRA(mf *dto.MetricFamily, ranks map[uint32]*acc) error {
	for _, m := range mf.GetMetric() {
		v, ok := value(m)
		if !ok {
			continue
		}
		var run, wait string
		maxLoRA := 0
		for _, lp := range m.GetLabel() {
			var err error
			switch lp.GetName() {
			case "running_lora_adapters":
				run, err = adapters(lp.GetValue())
			case "waiting_lora_adapters":
				wait, err = adapters(lp.GetValue())
			case "max_lora":
				n, perr := strconv.ParseUint(lp.GetValue(), 10, 16)
				if perr != nil {
					err = fmt.Errorf("max_lora=%q is not a count", lp.GetValue())
				}
				maxLoRA = int(n)
			}
			if err != nil {
				return fmt.Errorf("%w: %s: %v", ErrMalformed, loraMetric, err)
			}
		}
		a, err := accOf(ranks, 0, EngineVLLM)
		if err != nil {
			return err
		}
		if !a.lora || v > a.loraAt {
			a.lora, a.loraAt, a.loraRun, a.loraWait, a.maxLoRA = true, v, run, wait, maxLoRA
		}
	}
	return nil
}

// adapters normalises a comma-joined adapter list: names trimmed, empty
// ones dropped, at most MaxLoRAAdapters.
func adapters(s string) (string, error) {
	list := Adapters(s)
	if len(list) > MaxLoRAAdapters {
		return "", fmt.Errorf("more than %d adapters", MaxLoRAAdapters)
	}
	return strings.Join(list, ","), nil
}

// accOf returns rank's accumulator, creating it for engine.
func accOf(ranks map[uint32]*acc, rank uint32, engine string) (*acc, error) {
	a := ranks[rank]
	if a == nil {
		if len(ranks) >= MaxRanks {
			return nil, fmt.Errorf("%w: more than %d data-parallel ranks", ErrMalformed, MaxRanks)
		}
		a = &acc{engine: engine}
		ranks[rank] = a
	}
	return a, nil
}

// readHist adds each series of latency histogram mf (its _sum and _count)
// to its rank's totals: several series of one rank (SGLang's tp_rank or
// is_streaming labels) partition its requests, so they add up. A series
// whose sum or count is negative, NaN or infinite is an error.
func readHist(mf *dto.MetricFamily, engine string, h hist, ranks map[uint32]*acc) error {
	for _, m := range mf.GetMetric() {
		hm := m.GetHistogram()
		if hm == nil {
			continue // not typed histogram: not the engine's
		}
		sum, count := hm.GetSampleSum(), float64(hm.GetSampleCount())
		if math.IsNaN(sum) || math.IsInf(sum, 0) || sum < 0 {
			return fmt.Errorf("%w: %s: sum %g is not a duration", ErrMalformed, mf.GetName(), sum)
		}
		rank, err := rankOf(m, rankLabel[engine])
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrMalformed, mf.GetName(), err)
		}
		a, err := accOf(ranks, rank, engine)
		if err != nil {
			return err
		}
		t := &a.hist[h]
		t.Sum, t.Count, t.Has = t.Sum+sum, t.Count+count, true
		if math.IsInf(t.Sum, 0) || math.IsInf(t.Count, 0) {
			return fmt.Errorf("%w: %s: the sum of rank %d's series overflows", ErrMalformed, mf.GetName(), rank)
		}
	}
	return nil
}
