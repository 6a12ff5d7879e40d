package loadbench

import (
	"context"
	"testing"
)

// BenchmarkProbeChannel and BenchmarkProbeUnary are one mode of the probe
// benchmark each, for profiles (go test -cpuprofile); b.N probes at 5,000/s.
func BenchmarkProbeChannel(b *testing.B) { benchProbe(b, "channel") }
func BenchmarkProbeUnary(b *testing.B)   { benchProbe(b, "unary") }

func benchProbe(b *testing.B, mode string) {
	res, err := Probe(context.Background(), ProbeConfig{Rate: 5000, N: max(b.N, 100), Rounds: 1, Only: mode})
	if err != nil {
		b.Fatal(err)
	}
	f := res.Channel
	if mode == "unary" {
		f = res.Unary
	}
	b.ReportMetric(f.P99us, "p99-µs")
	b.ReportMetric(f.CPUusPerProbe, "cpu-µs/probe")
}

// TestProbeSmoke runs both modes briefly: every probe answered.
func TestProbeSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 1M-entry index")
	}
	res, err := Probe(context.Background(), ProbeConfig{Rate: 2000, N: 200, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]ProbeFigures{"channel": res.Channel, "unary": res.Unary} {
		if f.Probes != 200 || f.Errors != 0 {
			t.Errorf("%s: %d probes answered, %d failed; want 200, 0", name, f.Probes, f.Errors)
		}
	}
}
