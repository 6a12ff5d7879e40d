package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplayEngineProfile: the engine flags reach the report, which names
// the profile; bad values are refused with the flag named.
func TestReplayEngineProfile(t *testing.T) {
	dir := t.TempDir()
	timing := filepath.Join(dir, "h100.yaml")
	if err := os.WriteFile(timing, []byte("prefill_ms: {quadratic: 8.42e-7, linear: 0.03036, constant: 33}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--generate", "agentic:sessions=2,max_turns=2,seed=1", "--max-requests", "8", "--workers", "2", "--policies", "round-robin,llm-d", "--json"}
	var stdout, stderr bytes.Buffer
	args := append(base, "--engine-speeds", "1,0.5", "--engine-timing", timing, "--engine-noise", "0.2", "--engine-scrape-delay", "50ms")
	if err := replayCmd(context.Background(), nil, "replay", args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep struct {
		Engines struct {
			Name string `json:"name"`
		} `json:"engines"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if want := "speeds=1,0.5 timing=h100.yaml noise=0.2 scrape=500ms+50ms"; rep.Engines.Name != want {
		t.Errorf("engine profile %q, want %q", rep.Engines.Name, want)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("prefill_ms:\n  cubic: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine-speeds", "1,1,1"}, "3 engine speeds for 2 workers"},
		{[]string{"--engine-speeds", "1,x"}, "--engine-speeds"},
		{[]string{"--engine-timing", bad}, "bad.yaml:2"},
		{[]string{"--engine-noise", "1.5"}, "engine noise"},
		{[]string{"--engine-scrape-period", "0", "--engine-scrape-delay", "1s"}, "--engine-scrape-delay needs"},
	} {
		stdout.Reset()
		stderr.Reset()
		err := replayCmd(context.Background(), nil, "replay", append(base[:len(base):len(base)], tc.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("replay %v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// TestReplayScrapeKnobWarnings: scrape flags no replayed policy reads,
// and signal readers without scrapes, are warned about.
func TestReplayScrapeKnobWarnings(t *testing.T) {
	base := []string{"--generate", "agentic:sessions=2,max_turns=2,seed=1", "--max-requests", "4", "--workers", "2"}
	for _, tc := range []struct {
		args []string
		want string // "" for no warning
	}{
		{[]string{"--policies", "round-robin", "--engine-scrape-delay", "10ms"}, "no policy replayed reads engine signals"},
		{[]string{"--policies", "round-robin,llm-d", "--engine-scrape-delay", "10ms"}, ""},
		{[]string{"--policies", "round-robin,llm-d,kvgate,chain:waiting=1", "--engine-scrape-period", "0"}, "llm-d, kvgate, chain:waiting=1 read engine signals"},
		{[]string{"--policies", "round-robin,dynamo", "--engine-scrape-period", "0"}, ""},
	} {
		var stdout, stderr bytes.Buffer
		if err := replayCmd(context.Background(), nil, "replay", append(base[:len(base):len(base)], tc.args...), &stdout, &stderr); err != nil {
			t.Fatalf("replay %v: %v", tc.args, err)
		}
		got := stderr.String()
		if (tc.want == "") != !strings.Contains(got, "warning") || !strings.Contains(got, tc.want) {
			t.Errorf("replay %v: stderr %q, want a warning containing %q", tc.args, got, tc.want)
		}
	}
}
