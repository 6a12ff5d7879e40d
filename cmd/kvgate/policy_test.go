package main

import (
	"bytes"
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
		{"unknown-field", []string{"check", "testdata/policy/unknown-field.yaml"}, 1},
		{"bad-policy-file", []string{"check", "testdata/policy/bad-policy-file.yaml"}, 1},
		{"missing-policy-file", []string{"check", "testdata/policy/missing-policy-file.yaml"}, 1},
		{"bad-shadow-file", []string{"check", "-shadow-config", "testdata/policy/bad-shadow.yaml", "testdata/policy/good.yaml"}, 1},
		{"bad-shadow-block", []string{"check", "testdata/policy/bad-shadow-block.yaml"}, 1},
		{"one-bad-of-two", []string{"check", "testdata/policy/good.yaml", "testdata/policy/unknown-field.yaml"}, 1},
		{"no-file", []string{"check"}, 2},
		{"unknown-flag", []string{"check", "-strict", "x.yaml"}, 2},
		{"replay", []string{"replay", "testdata/policy/good.yaml", "--trace", "t.jsonl"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := policyCmd(tt.args, &stdout, &stderr)
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
	files, err := filepath.Glob("../../examples/pools*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("examples: %v, %v", files, err)
	}
	var stdout, stderr bytes.Buffer
	if err := policyCmd(append([]string{"check"}, files...), &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
	}
	for _, f := range files {
		if !strings.Contains(stdout.String(), f+": ok\n") {
			t.Errorf("no %q line in:\n%s", f+": ok", stdout.String())
		}
	}
}
