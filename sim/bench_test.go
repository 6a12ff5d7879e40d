package sim

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// syntheticTrace is the public Mooncake synthetic trace, kept beside the
// repository (../shared/traces/ from the repository root).
var syntheticTrace = filepath.Join("..", "..", "shared", "traces", "mooncake_synthetic_trace.jsonl")

// BenchmarkReplay replays the first 200 requests of the synthetic trace (a
// generated trace when it is absent) on 8 workers under kvgate's default
// and round-robin, and reports simulated requests per wall second.
func BenchmarkReplay(b *testing.B) {
	var tr *Trace
	if _, err := os.Stat(syntheticTrace); err == nil {
		if tr, err = LoadTraceFile(syntheticTrace, LoadOptions{Strict: true}); err != nil {
			b.Fatal(err)
		}
	} else {
		tr = randomTrace(b, 200, 1)
	}
	cfg := Config{
		Trace: tr, MaxRequests: 200, Rate: 4, Seed: 1, Workers: 8,
		Policies: []Policy{KVGate(), {Name: KindRoundRobin, Kind: KindRoundRobin}},
	}
	b.ReportAllocs()
	b.ResetTimer()
	simulated := 0
	for b.Loop() {
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		simulated += rep.Replay.SimulatedRequests
	}
	b.ReportMetric(float64(simulated)/b.Elapsed().Seconds(), "requests/s")
}
