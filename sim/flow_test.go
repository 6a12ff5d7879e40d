package sim

import (
	"testing"
)

// burstTrace is n one-off prompts of 16 blocks (1024 tokens) arriving
// 2 ms apart: far more than two workers prefill as fast.
func burstTrace(t *testing.T, n int) *Trace {
	t.Helper()
	var lines []string
	for i := range n {
		ids := make([]int, 16)
		for j := range ids {
			ids[j] = 1 + i*100 + j
		}
		lines = append(lines, mooncakeLine(2*i, 20, ids...))
	}
	return loadTestTrace(t, lines)
}

// flowPool is one pool whose saturation rule sheds (or, with the
// replay's flow control, queues) once 2048 prompt tokens wait on its best
// worker.
const flowPool = `
flow_control:
  enabled: true
  deadline: 30s
  saturation: {max_prefill_tokens: 2048}
pools:
  - name: pool-a
    models: [m]
    block_size: 16
    routers: {etcd: true}
`

// TestFlowControlReplay: under the same burst the shedding run (the
// saturation rule without the queue) refuses requests as saturated; with
// --flow-control the same requests wait in virtual time and all are
// served (the deadline and the TTFT targets the requests state are
// long). simulate checks every request ended and nothing stays in flight
// on the local router.
func TestFlowControlReplay(t *testing.T) {
	tr := burstTrace(t, 120)
	base := Config{Trace: tr, Workers: 2, SLOMS: map[int]float64{1: 60000, 0: 60000}, Global: &GlobalReplay{Config: globalConfig(t, flowPool), Name: "flow",
		Priorities: []Share{{Value: "1", Weight: 0.3}, {Value: "0", Weight: 0.7}}}}
	shed := runReport(t, base).Results[0]
	if shed.DecideRejected["saturated"] == 0 {
		t.Fatalf("shedding run: %+v rejected, want some saturated", shed.DecideRejected)
	}
	fc := base
	fc.FlowControl = true
	got := runReport(t, fc).Results[0]
	if got.Rejected != 0 || got.Completed != 120 {
		t.Errorf("flow control: %d completed, %d rejected (%v), want all 120 served", got.Completed, got.Rejected, got.DecideRejected)
	}
	t.Logf("shedding: %d served, %v refused, TTFT p99 %.0f ms; flow control: %d served, TTFT p99 %.0f ms",
		shed.Completed, shed.DecideRejected, shed.TTFTMS.P99, got.Completed, got.TTFTMS.P99)
	if shed.Completed >= got.Completed {
		t.Errorf("shedding served %d, flow control %d: want flow control to serve more", shed.Completed, got.Completed)
	}
}

// TestFlowControlReplayDeadline: with a deadline shorter than the burst
// takes to serve, the requests still waiting at it are refused
// (queue_deadline), none lost.
func TestFlowControlReplayDeadline(t *testing.T) {
	tr := burstTrace(t, 120)
	// Targets long enough not to bind (queue_late): the deadline does.
	cfg := Config{Trace: tr, Workers: 2, FlowControl: true, SLOMS: map[int]float64{0: 60000}, Global: &GlobalReplay{Name: "flow",
		Config: globalConfig(t, "flow_control: {enabled: true, deadline: 100ms, saturation: {max_prefill_tokens: 2048}}\n"+onePool)}}
	got := runReport(t, cfg).Results[0]
	if got.DecideRejected["queue_deadline"] == 0 || got.Completed+got.Rejected != 120 {
		t.Errorf("got %d completed, rejected %v, want some queue_deadline and 120 answered", got.Completed, got.DecideRejected)
	}
}

// TestFlowControlReplaySLO: under --flow-control each request states its
// class's TTFT target (x-kvgate-ttft-ms), which bounds its wait below the
// queue's deadline: with a 30 s deadline, a 100 ms target refuses the
// requests that can no longer meet it: at the door when the predicted
// time to first token alone passes it, at dispatch when the wait plus
// the predicted time to first token on the worker it got does
// (queue_late), at the target less the predicted TTFT when still
// waiting (queue_deadline); a 60 s target none.
func TestFlowControlReplaySLO(t *testing.T) {
	tr := burstTrace(t, 120)
	for _, c := range []struct {
		slo     float64
		refused bool
	}{{100, true}, {60000, false}} {
		cfg := Config{Trace: tr, Workers: 2, FlowControl: true, SLOMS: map[int]float64{0: c.slo},
			Global: &GlobalReplay{Name: "flow", Config: globalConfig(t, flowPool)}}
		got := runReport(t, cfg).Results[0]
		refused := got.DecideRejected["queue_deadline"] + got.DecideRejected["queue_late"]
		if (refused > 0) != c.refused || got.Completed+got.Rejected != 120 {
			t.Errorf("target %v ms: %d completed, rejected %v; want refusals at the target: %v, 120 answered", c.slo, got.Completed, got.DecideRejected, c.refused)
		}
	}
}
