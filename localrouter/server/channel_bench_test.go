package server

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/benchfig"
	"github.com/kvgate/kvgate/localrouter/client"
)

// BenchmarkChannelBestWorker: BenchmarkBestWorkerGRPC's probe over a
// Channel, one at a time: what a probe costs both ends (allocations, CPU)
// beyond the router's own work, without pacing.
func BenchmarkChannelBestWorker(b *testing.B) {
	c, prompts := benchService(b)
	ch := c.Channel(client.ChannelOptions{})
	b.Cleanup(func() { ch.Close() })
	ctx := context.Background()
	hp := make([]client.Prompt, len(prompts))
	for i, p := range prompts {
		hp[i] = client.HashPrompt(p.Local, benchfig.BlockSize)
	}
	if _, err := ch.BestWorker(ctx, hp[0], client.BestWorkerOptions{}); err != nil {
		b.Fatal(err) // opens the stream
	}
	durs := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := ch.BestWorker(ctx, hp[i%len(hp)], client.BestWorkerOptions{}); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(t0))
	}
	cpu := cpuTime() - cpu0
	b.StopTimer()
	reportLatency(b, durs, cpu)
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/probe")
}
