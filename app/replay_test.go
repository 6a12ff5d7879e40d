package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The overload flags: a replay of the shedding example at twice its
// measured capacity with both mixes prints the capacity and the figures
// by priority and tenant; bad values are refused naming the flag.
func TestReplayOverloadFlags(t *testing.T) {
	// 200 one-off prompts of 1 to 4 blocks of 512 tokens, 20 ms apart.
	var tr strings.Builder
	for i := range 200 {
		n := 1 + i%4
		ids := make([]string, n)
		for j := range ids {
			ids[j] = strconv.Itoa(i*8 + j)
		}
		fmt.Fprintf(&tr, `{"timestamp": %d, "input_length": %d, "output_length": 20, "hash_ids": [%s]}`+"\n", 20*i, 512*n, strings.Join(ids, ","))
	}
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(trace, []byte(tr.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	gen := []string{"--config", "../examples/pools-overload.yaml", "--trace", trace, "--workers", "2"}
	var stdout, stderr bytes.Buffer
	err := replayCmd(context.Background(), nil, "replay", append(gen, "--load", "2", "--priority-mix", "1=0.3,0=0.7",
		"--tenant-mix", "a=4,b=1,c=1,d=1", "--slo-ms", "1=500,0=5000", "--json"), &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep struct {
		Load     float64 `json:"load"`
		Capacity struct {
			RPS float64 `json:"rps"`
		} `json:"capacity"`
		Results []struct {
			ByPriority map[string]struct {
				TTFTMS      map[string]float64 `json:"ttft_ms"`
				SLOMetRatio *float64           `json:"slo_met_ratio"`
				Rejected    *int               `json:"rejected"`
			} `json:"by_priority"`
			ByTenant     map[string]json.RawMessage `json:"by_tenant"`
			JainFairness *float64                   `json:"jain_fairness"`
			GoodputRPS   *float64                   `json:"goodput_rps"`
		} `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if rep.Load != 2 || rep.Capacity.RPS <= 0 || len(rep.Results) != 1 {
		t.Fatalf("report %s", stdout.String())
	}
	r := rep.Results[0]
	if len(r.ByPriority) != 2 || len(r.ByTenant) != 4 || r.JainFairness == nil || r.GoodputRPS == nil {
		t.Fatalf("result %s", stdout.String())
	}
	for p, c := range r.ByPriority {
		if _, ok := c.TTFTMS["p99"]; !ok || c.SLOMetRatio == nil || c.Rejected == nil {
			t.Errorf("by_priority[%s] lacks a field: %+v", p, c)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tenant-mix", "a=x"}, "--tenant-mix"},
		{[]string{"--slo-ms", "1=soon", "--priority-mix", "1=1"}, "--slo-ms"},
		{[]string{"--slo-ms", "5=100", "--priority-mix", "1=1"}, "priority 5"},
		{[]string{"--load", "-2"}, "--load"},
		{[]string{"--load", "2", "--rate", "3"}, "--rate does not apply"},
	} {
		err := replayCmd(context.Background(), nil, "replay", append(append([]string{}, gen...), c.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error naming %q", c.args, err, c.want)
		}
	}
	err = replayCmd(context.Background(), nil, "replay", []string{"--generate", "agentic", "--tenant-mix", "a=1"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "need --config") {
		t.Errorf("--tenant-mix without --config: %v", err)
	}
}

// -overload-flow-control turns the in-process system's queue on: without
// -overload nothing reads it, nor with -overload-addr (another gateway's
// file says whether it queues); both are refused naming the flag.
func TestBenchOverloadFlowControlFlag(t *testing.T) {
	ctx := context.Background()
	if err := Run(ctx, []string{"bench", "-overload-flow-control"}); err == nil || !strings.Contains(err.Error(), "-overload-flow-control is read by -overload only") {
		t.Errorf("without -overload: %v", err)
	}
	err := Run(ctx, []string{"bench", "-overload", "-overload-flow-control", "-overload-addr", "http://127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), "-overload-flow-control") || !strings.Contains(err.Error(), "-overload-addr") {
		t.Errorf("with -overload-addr: %v", err)
	}
}

// TestReplayConfigRefusesTopologyFromEnv: --config replays the file's
// pools, so a topology set through KVGATE_TOPOLOGY is refused as
// --topology is (it used to be read from the command line only).
func TestReplayConfigRefusesTopologyFromEnv(t *testing.T) {
	t.Setenv("KVGATE_TOPOLOGY", "pools=2")
	var stdout, stderr bytes.Buffer
	err := replayCmd(context.Background(), nil, "replay", []string{"--config", "../examples/pools.yaml", "--generate", "agentic"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--topology and --policies do not apply") {
		t.Errorf("error %v, want the refusal of --topology", err)
	}
}

// TestReplayConfigRefusesBlockSize: with --config each pool replays with
// its own block_size; --block-size, which it would not read, is refused.
func TestReplayConfigRefusesBlockSize(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := replayCmd(context.Background(), nil, "replay", []string{"--config", "../examples/pools.yaml", "--generate", "agentic", "--block-size", "64"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--block-size does not apply") {
		t.Errorf("error %v, want the refusal of --block-size", err)
	}
}
