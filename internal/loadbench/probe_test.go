package loadbench

import (
	"context"
	"flag"
	"os"
	"testing"
)

var probeProfile = flag.String("probeprofile", "", "write a CPU profile of the probe benchmark's paced window only (not the index build) to this file")

// BenchmarkProbeChannel and BenchmarkProbeUnary are one mode of the probe
// benchmark each, for profiles (-probeprofile, or go test -cpuprofile
// with the index build); b.N probes at 5,000/s. BenchmarkProbeHarness is
// the pacing alone, a probe that does nothing.
func BenchmarkProbeChannel(b *testing.B) { benchProbe(b, "channel") }
func BenchmarkProbeUnary(b *testing.B)   { benchProbe(b, "unary") }
func BenchmarkProbeHarness(b *testing.B) { benchProbe(b, "harness") }

func benchProbe(b *testing.B, mode string) {
	cfg := ProbeConfig{Rate: 5000, N: max(b.N, 100), Rounds: 1, Only: mode}
	if *probeProfile != "" && b.N > 1 {
		f, err := os.Create(*probeProfile)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		cfg.Profile = f
	}
	res, err := Probe(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	f := map[string]ProbeFigures{"channel": res.Channel, "unary": res.Unary, "harness": res.Harness}[mode]
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
