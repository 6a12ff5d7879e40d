package overload

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...) }

// TestShortRun: a brief overload of `kvgate up` in the process with both
// mixes: every request sent is served, refused or failed (none failed),
// the figures are there by priority and by tenant, and every local
// router's in-flight count is 0 after; the same with the in-process
// system's flow control on (-overload-flow-control), where the report
// says so.
func TestShortRun(t *testing.T) {
	for _, fc := range []bool{false, true} {
		t.Run(map[bool]string{false: "shedding", true: "flow-control"}[fc], func(t *testing.T) { shortRun(t, fc) })
	}
}

func shortRun(t *testing.T, flowControl bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := DefaultConfig()
	cfg.Up.Speedup, cfg.Up.NumBlocks = 10, 2048
	cfg.Up.FlowControl.Enabled = flowControl
	cfg.Calibration, cfg.Duration, cfg.CalibrationStreams, cfg.MaxTokens = time.Second, 1500*time.Millisecond, 8, 8
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.FlowControl != flowControl {
		t.Errorf("report's flow_control %v, want %v", rep.FlowControl, flowControl)
	}
	if rep.CapacityRPS <= 0 || rep.Sent == 0 {
		t.Fatalf("report %+v: want a capacity and requests sent", rep)
	}
	if rep.Sent != rep.Completed+rep.Rejected+rep.Failed || rep.Failed != 0 {
		t.Errorf("sent %d = completed %d + rejected %d + failed %d (%s): want none failed", rep.Sent, rep.Completed, rep.Rejected, rep.Failed, rep.FailedSample)
	}
	offered := 0
	for p, c := range rep.ByPriority {
		if p != "0" && p != "1" {
			t.Errorf("priority %q: not of the mix", p)
		}
		offered += c.Offered
	}
	if offered != rep.Sent || len(rep.ByTenant) == 0 || rep.JainFairness == nil {
		t.Errorf("by priority %d of %d sent; by tenant %v; jain %v", offered, rep.Sent, rep.ByTenant, rep.JainFairness)
	}
	if !rep.InFlightChecked {
		t.Fatal("in-flight counts not read")
	}
	for p, n := range rep.InFlightAfter {
		if n != 0 {
			t.Errorf("pool %s: %d requests in flight after the run", p, n)
		}
	}
	var b bytes.Buffer
	rep.Print(&b)
	for _, want := range []string{"capacity", "priority 1", "in-flight after"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("printed report lacks %q:\n%s", want, b.String())
		}
	}
}

func TestConfigErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []Config{
		{Load: -1},
		{Priorities: []sim.Share{{Value: "high", Weight: 1}}},
		{Addr: "http://127.0.0.1:1", Up: up.Config{FlowControl: flowcontrol.Config{Enabled: true}}},
	} {
		if _, err := Run(ctx, c); err == nil || !strings.Contains(err.Error(), "overload") {
			t.Errorf("%+v: got %v, want an overload error", c, err)
		}
	}
	cfg := DefaultConfig()
	cfg.SLOMS = map[int]float64{1: 100}
	if _, err := sloTargets(cfg, 10); err == nil || !strings.Contains(err.Error(), "priority 0") {
		t.Errorf("slo without priority 0: %v", err)
	}
	cfg.SLOMS = nil
	got, err := sloTargets(cfg, 10.5)
	if err != nil || got[1] != 21 || got[0] != 105 {
		t.Errorf("default slo %v, %v", got, err)
	}
}
