package loadbench

import (
	"context"
	"flag"
	"os"
	"testing"
)

var (
	probeProfile       = flag.String("probeprofile", "", "write a CPU profile of the probe benchmark's paced window only (not the index build) to this file (and the server process's to FILE.server)")
	probePacked        = flag.Bool("probepacked", false, "the probe benchmark's channel sends packed hashes")
	probeServerProcess = flag.Bool("probeserverprocess", false, "serve the probe benchmark's router from a child process (client and server CPU apart)")
)

// TestMain lets the test binary be a benchmark's server process.
func TestMain(m *testing.M) {
	if ServeChild() || serveTestChild() {
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkProbeChannel and BenchmarkProbeUnary are one mode of the probe
// benchmark each, for profiles (-probeprofile, or go test -cpuprofile
// with the index build); b.N probes at 5,000/s. BenchmarkProbeHarness is
// the pacing alone, a probe that does nothing; BenchmarkProbeGRPCFloor a
// bare gRPC round trip of a probe's size.
func BenchmarkProbeChannel(b *testing.B)   { benchProbe(b, "channel") }
func BenchmarkProbeUnary(b *testing.B)     { benchProbe(b, "unary") }
func BenchmarkProbeHarness(b *testing.B)   { benchProbe(b, "harness") }
func BenchmarkProbeGRPCFloor(b *testing.B) { benchProbe(b, "grpc-floor") }

func benchProbe(b *testing.B, mode string) {
	cfg := ProbeConfig{Rate: 5000, N: max(b.N, 100), Rounds: 1, Only: mode, ServerProcess: *probeServerProcess, PackedHashes: *probePacked}
	if *probeProfile != "" && b.N > 1 {
		f, err := os.Create(*probeProfile)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		cfg.Profile = f
		if cfg.ServerProcess {
			cfg.ServerProfile = *probeProfile + ".server"
		}
	}
	res, err := Probe(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	f := map[string]ProbeFigures{"channel": res.Channel, "unary": res.Unary, "harness": res.Harness, "grpc-floor": res.GRPCFloor}[mode]
	b.ReportMetric(f.P99us, "p99-µs")
	b.ReportMetric(f.CPUusPerProbe, "cpu-µs/probe")
	if cfg.ServerProcess {
		b.ReportMetric(f.ClientCPUusPerProbe, "client-cpu-µs/probe")
		b.ReportMetric(f.ServerCPUusPerProbe, "server-cpu-µs/probe")
	}
}

// TestProbeSmoke runs both modes briefly: every probe answered.
func TestProbeSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 1M-entry index")
	}
	for _, apart := range []bool{false, true} {
		res, err := Probe(context.Background(), ProbeConfig{Rate: 2000, N: 200, Rounds: 2, ServerProcess: apart})
		if err != nil {
			t.Fatalf("server process %v: %v", apart, err)
		}
		for name, f := range map[string]ProbeFigures{"channel": res.Channel, "unary": res.Unary, "harness": res.Harness, "grpc-floor": res.GRPCFloor} {
			if f.Probes != 200 || f.Errors != 0 {
				t.Errorf("server process %v: %s: %d probes answered, %d failed; want 200, 0", apart, name, f.Probes, f.Errors)
			}
			if got := f.ServerCPUusPerProbe > 0; name != "harness" && got != apart {
				t.Errorf("server process %v: %s: server CPU measured apart: %v", apart, name, got)
			}
		}
	}
}
