package app

import (
	"strings"
	"testing"
)

// TestUpTopologyFlags: each -topology reads its own pool flags; another
// topology's, set, is refused naming the flag and the topology that
// reads it, instead of being passed over (the pools are the topology's).
func TestUpTopologyFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		err  string // "" : accepted
	}{
		{[]string{"-pool-a-workers=4", "-pool-b-dp-size=1"}, ""},
		{[]string{"-topology=regions", "-region-pool-workers=3"}, ""},
		{[]string{"-topology=disaggregated", "-prefill-workers=2", "-decode-workers=3"}, ""},
		{[]string{"-topology=regions", "-pool-a-workers=4"}, "-pool-a-workers set but not read: read by -topology flat only (this is -topology regions)"},
		{[]string{"-topology=disaggregated", "-pool-b-worker-chain=cost"}, "-pool-b-worker-chain set but not read: read by -topology flat only"},
		{[]string{"-prefill-workers=2"}, "-prefill-workers set but not read: read by -topology disaggregated only (this is -topology flat)"},
		{[]string{"-topology=disaggregated", "-region-pool-workers=1"}, "-region-pool-workers set but not read: read by -topology regions only"},
		{[]string{"-topology=regions", "-secure-serving"}, "-secure-serving: not supported with -topology regions"},
	} {
		cfg, _, err := parseUp(tt.args, nil)
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%v: %v", tt.args, err)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%v: error %v, want one containing %q", tt.args, err, tt.err)
		case tt.err == "" && len(cfg.Pools) == 0:
			t.Errorf("%v: no pools", tt.args)
		}
	}
}

// TestUpNumbers: -metrics-period 0 means never, as the local router's
// flag does (up.Config's 0 would be its 500ms default); a body limit or a
// speed-up that is not positive is refused (both were replaced by their
// defaults in silence).
func TestUpNumbers(t *testing.T) {
	cfg, _, err := parseUp([]string{"-metrics-period=0"}, nil)
	if err != nil || cfg.MetricsPeriod >= 0 {
		t.Errorf("-metrics-period 0: %v, %v; want a negative period (never)", cfg.MetricsPeriod, err)
	}
	for args, want := range map[string]string{"-max-body-bytes=0": "-max-body-bytes 0: want a positive limit", "-speedup=0": "-speedup 0: want a positive factor"} {
		if _, _, err := parseUp([]string{args}, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}
