package signals

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var at = time.Unix(1700000000, 0)

// vllmDP2 is shaped like vLLM's exposition with two engines (DP ranks),
// prometheus_client's text format: counters end in _total, with _created
// gauges next to them.
const vllmDP2 = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.97
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions_total{engine="1",model_name="m"} 0.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 0.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
`

// vllmOld uses the names vLLM deprecated in 0.9.
const vllmOld = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 5
`

// sglangDP2 is shaped like SGLang's SchedulerMetricsCollector with DP
// attention on (a dp_rank label) and two TP ranks each.
const sglangDP2 = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 4.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 9.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.8
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 0.1
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.5
sglang:cache_hit_rate{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 0.0
# HELP sglang:num_retracted_reqs The number of retracted requests.
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 1.0
`

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		body string
		want map[uint32]Sample
	}{
		{"vllm dp 2", vllmDP2, map[uint32]Sample{
			0: {Engine: EngineVLLM, Running: 3, Waiting: 2, KVUsage: 0.97, HasKVUsage: true, Preemptions: 7, PrefixHitRate: 0.25, HasPrefixHitRate: true,
				TTFT: HistogramTotals{Sum: 0.5, Count: 4, Has: true}, At: at},
			1: {Engine: EngineVLLM, Running: 1, Waiting: 0, KVUsage: 0.25, HasKVUsage: true, PrefixHitRate: 0, HasPrefixHitRate: true, At: at},
		}},
		{"vllm before 0.9", vllmOld, map[uint32]Sample{
			0: {Engine: EngineVLLM, Running: 1, KVUsage: 0.5, HasKVUsage: true, PrefixHitRate: 0.5, HasPrefixHitRate: true, At: at},
		}},
		{"sglang dp 2", sglangDP2, map[uint32]Sample{
			0: {Engine: EngineSGLang, Running: 4, Waiting: 9, KVUsage: 0.8, HasKVUsage: true, Preemptions: 1, PrefixHitRate: 0.5, HasPrefixHitRate: true, At: at},
			1: {Engine: EngineSGLang, Running: 2, Waiting: 0, KVUsage: 0.1, HasKVUsage: true, PrefixHitRate: 0, HasPrefixHitRate: true, At: at},
		}},
		{"bad values ignored", "vllm:num_requests_running NaN\nvllm:num_requests_waiting -1\nvllm:kv_cache_usage_perc 7\n", map[uint32]Sample{
			0: {Engine: EngineVLLM, KVUsage: 1, HasKVUsage: true, At: at},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.body), 0, at)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
		max  int64
		want error
	}{
		{"too large", vllmDP2, 100, ErrTooLarge},
		{"exactly the bound is fine", "vllm:num_requests_running 1\n", int64(len("vllm:num_requests_running 1\n")), nil},
		{"not an exposition", "{\"json\": true}", 0, ErrMalformed},
		{"bad rank label", `vllm:num_requests_running{engine="x"} 1` + "\n", 0, ErrMalformed},
		{"rank beyond uint32", `vllm:num_requests_running{engine="99999999999"} 1` + "\n", 0, ErrMalformed},
		{"other metrics only", "go_goroutines 5\n", 0, ErrNoSignals},
		{"empty", "", 0, ErrNoSignals},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tt.body), tt.max, at)
			if !errors.Is(err, tt.want) {
				t.Errorf("Parse error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestParseBoundsRanks(t *testing.T) {
	var b strings.Builder
	for i := 0; i <= MaxRanks; i++ {
		b.WriteString(`vllm:num_requests_running{engine="`)
		b.WriteString(strconv.Itoa(i))
		b.WriteString("\"} 1\n")
	}
	if _, err := Parse(strings.NewReader(b.String()), 0, at); !errors.Is(err, ErrMalformed) {
		t.Errorf("Parse of %d ranks: error %v, want ErrMalformed", MaxRanks+1, err)
	}
}

// FuzzParse: any body is an error or samples within their ranges, never a
// panic.
func FuzzParse(f *testing.F) {
	for _, s := range []string{vllmDP2, vllmOld, sglangDP2, vllmLoRA, vllmLatency, "", "# TYPE x gauge\nx 1\n", `vllm:num_requests_running{engine="1"} 1e308`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got, err := Parse(strings.NewReader(body), 1<<16, at)
		if err != nil {
			if got != nil {
				t.Fatalf("Parse returned samples with error %v", err)
			}
			return
		}
		if len(got) == 0 || len(got) > MaxRanks {
			t.Fatalf("Parse returned %d ranks", len(got))
		}
		for r, s := range got {
			if s.KVUsage < 0 || s.KVUsage > 1 || s.PrefixHitRate < 0 || s.PrefixHitRate > 1 || s.Waiting < 0 || s.Running < 0 {
				t.Fatalf("rank %d: sample out of range: %+v", r, s)
			}
			for _, h := range []HistogramTotals{s.TTFT, s.ITL, s.Queue, s.Prefill, s.Decode} {
				if h.Sum < 0 || h.Count < 0 || math.IsNaN(h.Sum) || math.IsInf(h.Sum, 0) {
					t.Fatalf("rank %d: histogram totals out of range: %+v", r, h)
				}
			}
			if s.Engine != EngineVLLM && s.Engine != EngineSGLang {
				t.Fatalf("rank %d: engine %q", r, s.Engine)
			}
		}
	})
}
