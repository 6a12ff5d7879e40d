package app

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files of the policy check")

// TestPolicyCheck pins what `kvgate policy check` prints and its exit status
// for good and bad files (testdata/policy/*.golden; -update rewrites them).
func TestPolicyCheck(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		status int
	}{
		{"good", []string{"check", "testdata/policy/good.yaml"}, 0},
		{"shadow-file", []string{"check", "-shadow-config", "testdata/policy/shadow.yaml", "testdata/policy/good.yaml"}, 0},
		{"shadow-block", []string{"check", "testdata/policy/shadow-block.yaml"}, 0},
		{"worker-chain", []string{"check", "testdata/policy/worker-chain.yaml"}, 0},
		{"unknown-field", []string{"check", "testdata/policy/unknown-field.yaml"}, 1},
		{"bad-policy-file", []string{"check", "testdata/policy/bad-policy-file.yaml"}, 1},
		{"missing-policy-file", []string{"check", "testdata/policy/missing-policy-file.yaml"}, 1},
		{"bad-shadow-file", []string{"check", "-shadow-config", "testdata/policy/bad-shadow.yaml", "testdata/policy/good.yaml"}, 1},
		{"bad-shadow-block", []string{"check", "testdata/policy/bad-shadow-block.yaml"}, 1},
		{"every-error-in-one-run", []string{"check", "testdata/policy/two-typos.yaml"}, 1},
		{"errors-of-every-kind", []string{"check", "testdata/policy/errors-of-every-kind.yaml"}, 1},
		{"etcd-given", []string{"check", "-etcd", "127.0.0.1:2379", "testdata/policy/good.yaml"}, 0},
		{"help", []string{"-h"}, 0},
		{"one-bad-of-two", []string{"check", "testdata/policy/good.yaml", "testdata/policy/unknown-field.yaml"}, 1},
		{"no-file", []string{"check"}, 2},
		{"unknown-flag", []string{"check", "-strict", "x.yaml"}, 2},
		{"replay-no-file", []string{"replay", "--trace", "t.jsonl"}, 2},
		{"replay-config-twice", []string{"replay", "testdata/policy/good.yaml", "--config", "x.yaml"}, 2},
		{"replay-bad-file", []string{"replay", "testdata/policy/unknown-field.yaml", "--trace", "t.jsonl"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := policyCmd(context.Background(), nil, tt.args, &stdout, &stderr)
			if got := exitStatus(err); got != tt.status {
				t.Errorf("exit status %d (err %v), want %d", got, err, tt.status)
			}
			errText := ""
			if err != nil {
				errText = "kvgate: policy: " + err.Error() + "\n"
			}
			got := fmt.Sprintf("$ kvgate policy %s\n# exit status %d\n# stdout\n%s# stderr\n%s%s", strings.Join(tt.args, " "), tt.status, stdout.String(), stderr.String(), errText)
			golden := filepath.Join("testdata", "policy", tt.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("%s differs (-want +got; -update accepts):\n%s", golden, diff)
			}
		})
	}
}

// TestPolicyCheckExamples: every shipped example configuration checks
// clean (their output is not pinned: the examples change).
func TestPolicyCheckExamples(t *testing.T) {
	files, err := filepath.Glob("../examples/pools*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("examples: %v, %v", files, err)
	}
	var stdout, stderr bytes.Buffer
	if err := policyCmd(context.Background(), nil, append([]string{"check"}, files...), &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
	}
	for _, f := range files {
		if !strings.Contains(stdout.String(), f+": ok\n") {
			t.Errorf("no %q line in:\n%s", f+": ok", stdout.String())
		}
	}
	// The tenancy example says where its tenant comes from.
	if want := "tenancy: header x-tenant, salted true, identity xfcc (the URI SAN's segment after spiffe://cluster.local/ns/)\n"; !strings.Contains(stdout.String(), want) {
		t.Errorf("no %q line in:\n%s", want, stdout.String())
	}
}

// TestPolicyReplay replays a configuration through the real Decide: the
// report names the configuration as the topology and every request is
// accounted for.
func TestPolicyReplay(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := policyCmd(context.Background(), nil, []string{"replay", "testdata/policy/good.yaml",
		"--generate", "agentic:sessions=6,max_turns=3,seed=2", "--max-requests", "40", "--workers", "4",
		"--pool-workers", "pool-a=1", "--models", "llama-3-8b=1", "--json"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep struct {
		Requests int `json:"requests"`
		Workers  int `json:"workers"`
		Results  []struct {
			Topology  string `json:"topology"`
			Policy    string `json:"policy"`
			Completed int    `json:"completed"`
			Rejected  int    `json:"rejected"`
		} `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if len(rep.Results) != 1 || rep.Workers != 4 {
		t.Fatalf("report: %+v", rep)
	}
	r := rep.Results[0]
	if r.Topology != "config:good.yaml" || r.Policy != "chain" || r.Completed == 0 || r.Completed+r.Rejected != rep.Requests {
		t.Fatalf("result %+v of %d requests", r, rep.Requests)
	}
	// kvgate replay --config is the same replay.
	var again bytes.Buffer
	err = replayCmd(context.Background(), nil, "replay", []string{"--config", "testdata/policy/good.yaml",
		"--generate", "agentic:sessions=6,max_turns=3,seed=2", "--max-requests", "40", "--workers", "4",
		"--pool-workers", "pool-a=1", "--models", "llama-3-8b=1", "--json"}, &again, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	strip := func(b []byte) string { // the wall-clock part differs
		i := bytes.Index(b, []byte(`"replay":`))
		return string(b[:i])
	}
	if strip(again.Bytes()) != strip(stdout.Bytes()) {
		t.Error("kvgate replay --config and kvgate policy replay differ")
	}
}

func TestReplayFlagConflicts(t *testing.T) {
	for _, args := range [][]string{
		{"--config", "testdata/policy/good.yaml", "--generate", "agentic", "--topology", "pools"},
		{"--config", "testdata/policy/good.yaml", "--generate", "agentic", "--policies", "dynamo"},
		{"--generate", "agentic", "--models", "a=1"},
		{"--generate", "agentic", "--sweep", "credit=1;nope=2"},
		{"--config", "testdata/policy/good.yaml", "--generate", "agentic", "--pool-workers", "pool-z=1"},
	} {
		var stdout, stderr bytes.Buffer
		if err := replayCmd(context.Background(), nil, "replay", args, &stdout, &stderr); err == nil {
			t.Errorf("replay %v: no error", args)
		}
	}
}

// TestReplaySaysWhereItWrote: --plot and --json-out name the files written.
func TestReplaySaysWhereItWrote(t *testing.T) {
	dir := t.TempDir()
	plot, js := filepath.Join(dir, "cdf.svg"), filepath.Join(dir, "rep.json")
	var stdout, stderr bytes.Buffer
	err := replayCmd(context.Background(), nil, "replay", []string{"--generate", "agentic:sessions=2,max_turns=2,seed=1",
		"--max-requests", "8", "--workers", "2", "--policies", "random", "--plot", plot, "--json-out", js}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, want := range []string{"wrote the TTFT CDF and hit ratio chart to " + plot, "wrote the report as JSON to " + js} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// TestShadowExample: the shipped shadow file checks clean with pools.yaml,
// as docs/operating.md runs it.
func TestShadowExample(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := policyCmd(context.Background(), nil, []string{"check", "-etcd", "127.0.0.1:2379", "-shadow-config", "../examples/shadow-candidate.yaml", "../examples/pools.yaml"}, &stdout, &stderr)
	if err != nil || stderr.Len() > 0 || !strings.Contains(stdout.String(), "shadow chain (5 policies") {
		t.Errorf("err %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
}
