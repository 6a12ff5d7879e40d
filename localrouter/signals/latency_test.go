package signals

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// vllmLatency is shaped like vLLM's latency histograms as
// prometheus_client writes them (vllm/v1/metrics/loggers.py at
// 005a810bc40faa25b8870fbc8559c3462581eee3, PrometheusStatLogger: labels
// model_name and engine; the time to first token's and time per output
// token's bucket layouts, request_latency_buckets for the per-request
// phases; a _created gauge beside each), two engines (DP ranks), the
// inter-token latency under both names later releases emit.
var vllmLatency = `# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
` + buckets("vllm:time_to_first_token_seconds", "0", []string{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0"}, 3, "0.75") +
	buckets("vllm:time_to_first_token_seconds", "1", []string{"0.001", "2560.0"}, 2, "4.0") + `# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="m"} 1.7000000001e+09
vllm:time_to_first_token_seconds_created{engine="1",model_name="m"} 1.7000000001e+09
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
` + buckets("vllm:time_per_output_token_seconds", "0", []string{"0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0"}, 40, "1.2") + `# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
` + buckets("vllm:inter_token_latency_seconds", "0", []string{"0.01", "80.0"}, 40, "1.2") + `# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
` + buckets("vllm:request_queue_time_seconds", "0", []string{"0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0"}, 2, "0.1") + `# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
` + buckets("vllm:request_prefill_time_seconds", "0", []string{"0.3", "7680.0"}, 2, "0.5") + `# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.
# TYPE vllm:request_decode_time_seconds histogram
` + buckets("vllm:request_decode_time_seconds", "0", []string{"0.3", "7680.0"}, 2, "1.25") + `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
`

// buckets writes one series of a histogram as prometheus_client does:
// cumulative buckets (all observations in the first here), +Inf, _count,
// _sum.
func buckets(name, engine string, les []string, count int, sum string) string {
	var b strings.Builder
	n := strconv.Itoa(count) + ".0"
	for _, le := range les {
		b.WriteString(name + `_bucket{engine="` + engine + `",le="` + le + `",model_name="m"} ` + n + "\n")
	}
	b.WriteString(name + `_bucket{engine="` + engine + `",le="+Inf",model_name="m"} ` + n + "\n")
	b.WriteString(name + `_count{engine="` + engine + `",model_name="m"} ` + n + "\n")
	b.WriteString(name + `_sum{engine="` + engine + `",model_name="m"} ` + sum + "\n")
	return b.String()
}

func TestParseLatencyHistograms(t *testing.T) {
	got, err := Parse(strings.NewReader(vllmLatency), 0, at)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := map[uint32]Sample{
		0: {Engine: EngineVLLM, Running: 1, At: at,
			TTFT:    HistogramTotals{Sum: 0.75, Count: 3, Has: true},
			ITL:     HistogramTotals{Sum: 1.2, Count: 40, Has: true},
			Queue:   HistogramTotals{Sum: 0.1, Count: 2, Has: true},
			Prefill: HistogramTotals{Sum: 0.5, Count: 2, Has: true},
			Decode:  HistogramTotals{Sum: 1.25, Count: 2, Has: true}},
		1: {Engine: EngineVLLM, At: at, TTFT: HistogramTotals{Sum: 4, Count: 2, Has: true}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	mean, n, ok := got[0].TTFT.Mean(HistogramTotals{Sum: 0.25, Count: 1, Has: true})
	if !ok || n != 2 || mean != 0.25 {
		t.Errorf("TTFT interval mean = %g over %g (ok %v), want 0.25 over 2", mean, n, ok)
	}
	if _, _, ok := got[0].TTFT.Mean(HistogramTotals{Sum: 9, Count: 9, Has: true}); ok {
		t.Error("Mean after a restart (totals went down) is ok, want not")
	}
}

// TestParseLatencyOldAndSGLang: vLLM before inter_token_latency_seconds
// (time_per_output_token_seconds alone), and SGLang's histograms
// (python/sglang/srt/metrics/collector.py at 93d04878: no dp_rank on the
// tokenizer's histograms, so rank 0; one series per is_streaming value,
// which add up).
func TestParseLatencyOldAndSGLang(t *testing.T) {
	old := buckets("vllm:time_per_output_token_seconds", "0", []string{"0.01"}, 5, "0.5")
	sg := "# TYPE sglang:time_to_first_token_seconds histogram\n" +
		`sglang:time_to_first_token_seconds_bucket{is_streaming="true",le="+Inf",model_name="m"} 2` + "\n" +
		`sglang:time_to_first_token_seconds_sum{is_streaming="true",model_name="m"} 1` + "\n" +
		`sglang:time_to_first_token_seconds_count{is_streaming="true",model_name="m"} 2` + "\n" +
		`sglang:time_to_first_token_seconds_bucket{is_streaming="false",le="+Inf",model_name="m"} 1` + "\n" +
		`sglang:time_to_first_token_seconds_sum{is_streaming="false",model_name="m"} 0.5` + "\n" +
		`sglang:time_to_first_token_seconds_count{is_streaming="false",model_name="m"} 1` + "\n" +
		"# TYPE sglang:queue_time_seconds histogram\n" +
		`sglang:queue_time_seconds_bucket{le="+Inf",model_name="m"} 3` + "\n" +
		`sglang:queue_time_seconds_sum{model_name="m"} 0.3` + "\n" +
		`sglang:queue_time_seconds_count{model_name="m"} 3` + "\n"
	for _, tt := range []struct {
		name, body string
		want       Sample
	}{
		{"vllm time_per_output_token", "# TYPE vllm:time_per_output_token_seconds histogram\n" + old,
			Sample{Engine: EngineVLLM, At: at, ITL: HistogramTotals{Sum: 0.5, Count: 5, Has: true}}},
		{"sglang", sg, Sample{Engine: EngineSGLang, At: at,
			TTFT: HistogramTotals{Sum: 1.5, Count: 3, Has: true}, Queue: HistogramTotals{Sum: 0.3, Count: 3, Has: true}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.body), 0, at)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(map[uint32]Sample{0: tt.want}, got); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}
