package app

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
)

// TestBenchFlagsReadOnlyByTheirMode: a bench knob set without the mode
// that reads it is refused, naming the flag and the mode; -commit takes
// only the modes the global router's configuration accepts (reserve is
// refused until the global router has it). Nothing runs: every case fails
// before a benchmark starts.
func TestBenchFlagsReadOnlyByTheirMode(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-commit", "decide"}, "-commit is read by -decision or -active-active only"},
		{[]string{"-probe-config", "x.yaml", "-probe"}, "-probe-config is read by -decision or -active-active only"},
		{[]string{"-decision-pools", "1,2", "-active-active", "2"}, "-decision-pools is read by -decision only"},
		{[]string{"-aa-kill", "-decision"}, "-aa-kill is read by -active-active only"},
		{[]string{"-decision", "-active-active", "2"}, "choose one"},
		{[]string{"-decision", "-commit", "nonsense"}, `-commit nonsense`},
		{[]string{"-decision", "-decision-pools", "1,x"}, "-decision-pools"},
		{[]string{"-active-active", "2", "-aa-pools", "0"}, "-aa-pools"},
		// Each mode's own flags, set for another mode, were ignored.
		{[]string{"-soak", "10", "-rate", "100"}, "-rate is read by -probe or -decision only"},
		{[]string{"-decision", "-probes", "100"}, "-probes is read by -probe only"},
		{[]string{"-probe", "-soak-hold", "1s"}, "-soak-hold is read by -soak only"},
		{[]string{"-overload", "-streams", "10"}, "-streams is read by -chaos only"},
		{[]string{"-probe", "-n", "500"}, "-n is read by the headline figures (no mode flag) only"},
		{[]string{"-json"}, "-json is read by the modes"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			err := runBench(context.Background(), tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := commitModes("reserve"); err != nil {
		t.Logf("-commit reserve is refused for now: %v", err)
	}
}

// TestBenchDecisionJSON: `kvgate bench -decision -json` prints one JSON
// object (one line) carrying the figures issue 26 names, the first run's
// at the top level and every run under "runs" (kvgate's side in this
// process, briefly; no timing threshold).
func TestBenchDecisionJSON(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	err = runBench(context.Background(), []string{"-decision", "-json", "-decision-server-process=false", "-rate", "200", "-decision-n", "40",
		"-decision-sequential", "10", "-decision-workers", "2", "-commit", "decide,pipelined", "-decision-pools", "1"})
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines printed, want one JSON object:\n%s", len(lines), out)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &obj); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, k := range []string{"decision_p50_us", "decision_p99_us", "tokenize_p50_us", "grpc_floor_p50_us", "round_trips_per_decision", "commit", "pools", "load_average"} {
		if v, ok := obj[k]; !ok || v == nil {
			t.Errorf("no %q in %s", k, out)
		}
	}
	if runs, _ := obj["runs"].([]any); len(runs) != 2 || obj["commit"] != "decide" {
		t.Errorf("runs %v, commit %v: want decide's and pipelined's, decide's at the top", len(runs), obj["commit"])
	}
}
