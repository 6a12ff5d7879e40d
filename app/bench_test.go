package app

import (
	"context"
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
