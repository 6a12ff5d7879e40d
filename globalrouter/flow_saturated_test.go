package globalrouter

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/policies"
)

// TestFlowSaturatedNeed: a pool past the saturation rule holds a request
// and reports its least predicted TTFT among the candidates (its need,
// which shortens its queue deadline); one candidate under the rule lets
// it go.
func TestFlowSaturatedNeed(t *testing.T) {
	cfg := flowcontrol.Config{Enabled: true}
	cfg.Defaults()
	cand := func(waiting int, ttftMs float64) policies.Candidate {
		return policies.Candidate{Pool: "p", Probe: routing.Selection{PrefillTokens: waiting, BlockSize: 16, TTFT: ttftMs}}
	}
	over := cfg.Saturation.MaxPrefillTokens + 1000
	if sat, need := flowSaturated(&cfg, []policies.Candidate{cand(over, 400), cand(over, 300)}, 10, 0); !sat || need != 300*time.Millisecond {
		t.Errorf("past the rule: saturated %v need %v, want true, 300ms", sat, need)
	}
	if sat, _ := flowSaturated(&cfg, []policies.Candidate{cand(over, 400), cand(100, 900)}, 10, 0); sat {
		t.Error("one pool under the rule: held, want dispatched")
	}
}
