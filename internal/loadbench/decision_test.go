package loadbench

import (
	"context"
	"flag"
	"testing"
)

var decisionProfile = flag.String("decisionprofile", "", "write a CPU profile of the decision benchmark's kvgate process over the paced window to this file (with -decisionserverprocess)")

// TestDecisionSmoke runs the paced decision benchmark briefly in both
// shapes: every exchange routed, every decision timed, the CPU of kvgate's
// side measured apart only when it runs apart.
func TestDecisionSmoke(t *testing.T) {
	for _, apart := range []bool{false, true} {
		res, err := Decision(context.Background(), DecisionConfig{Rate: 200, N: 100, ServerProcess: apart})
		if err != nil {
			t.Fatalf("server process %v: %v", apart, err)
		}
		if res.Requests != 100 || res.Errors != 0 || res.ExchangeP50us <= 0 || res.DecisionP50us <= 0 || res.DecisionP99us < res.DecisionP50us {
			t.Errorf("server process %v: %+v", apart, res)
		}
		if res.ServerProcess != apart || (res.ServerCPUusPerReq > 0) != apart {
			t.Errorf("server process %v: kvgate's CPU apart: %v (%.0f µs/req)", apart, res.ServerProcess, res.ServerCPUusPerReq)
		}
	}
}

// BenchmarkDecisionPaced is `kvgate bench -decision`: b.N requests at
// 1,000/s, kvgate in a child process (-decisionserverprocess=false: one).
func BenchmarkDecisionPaced(b *testing.B) {
	res, err := Decision(context.Background(), DecisionConfig{Rate: 1000, N: max(b.N, 100), ServerProcess: *decisionServerProcess, ServerProfile: *decisionProfile})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(res.ExchangeP99us, "exchange-p99-µs")
	b.ReportMetric(res.DecisionP50us, "decide-p50-µs")
	b.ReportMetric(res.DecisionP99us, "decide-p99-µs")
	b.ReportMetric(res.ClientCPUusPerReq, "client-cpu-µs/req")
	b.ReportMetric(res.ServerCPUusPerReq, "kvgate-cpu-µs/req")
	b.ReportMetric(res.Rate, "req/s")
}

var decisionServerProcess = flag.Bool("decisionserverprocess", true, "the decision benchmark's kvgate side in a child process")
