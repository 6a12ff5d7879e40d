package signals

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// vllmLoRA is shaped after vLLM's PrometheusStatLogger (vllm/v1/metrics/
// loggers.py, gauge_lora_info, vLLM v0.10): labels max_lora,
// waiting_lora_adapters and running_lora_adapters, adapters comma-joined,
// the value the time of the last update. An older label set lingers with
// an earlier timestamp.
const vllmLoRA = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters="old"} 1.7e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="legal"} 1.78e+09
`

func TestParseLoRA(t *testing.T) {
	got, err := Parse(strings.NewReader(vllmLoRA), 0, at)
	if err != nil {
		t.Fatal(err)
	}
	s := got[0]
	if !s.HasLoRA || s.MaxLoRA != 4 || s.Running != 2 {
		t.Fatalf("sample %+v: want HasLoRA, MaxLoRA 4, Running 2", s)
	}
	if d := cmp.Diff([]string{"sql", "chat"}, Adapters(s.LoRARunning)); d != "" {
		t.Errorf("running adapters (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"legal"}, Adapters(s.LoRAWaiting)); d != "" {
		t.Errorf("waiting adapters (-want +got):\n%s", d)
	}
	for _, c := range []struct {
		name          string
		running, wait bool
	}{{"sql", true, false}, {"legal", false, true}, {"old", false, false}, {"", false, false}} {
		if r, w := s.HasAdapter(c.name); r != c.running || w != c.wait {
			t.Errorf("HasAdapter(%q) = %v, %v; want %v, %v", c.name, r, w, c.running, c.wait)
		}
	}
	// Without the gauge: no LoRA information.
	plain, err := Parse(strings.NewReader(vllmDP2), 0, at)
	if err != nil {
		t.Fatal(err)
	}
	if plain[0].HasLoRA {
		t.Errorf("HasLoRA without vllm:lora_requests_info")
	}
	bad := `vllm:lora_requests_info{max_lora="x",running_lora_adapters="a"} 1` + "\n"
	if _, err := Parse(strings.NewReader(bad), 0, at); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad max_lora: error %v, want ErrMalformed", err)
	}
}
