package mocker

import (
	"strconv"
	"testing"
	"time"
)

// BenchmarkEngineStep drives the engine core in virtual time the way the
// trace simulator does: requests of 1024 prompt tokens (half a shared
// prefix) and 64 output tokens, 64 in flight, into an 8192-block cache. One
// op is one Step; ns/req is wall time per request served end to end and
// sim-s/s simulated time per wall second.
func BenchmarkEngineStep(b *testing.B) {
	const inFlight, promptLen, outLen = 64, 1024, 64
	shared := prompt(1, promptLen/2)
	prompts := make([][]uint32, 256)
	for i := range prompts {
		prompts[i] = append(append([]uint32{}, shared...), prompt(uint32(i+2), promptLen/2)...)
	}
	eng, _ := NewEngine(Config{})
	now := t0
	submitted, done := 0, 0
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		for submitted-done < inFlight {
			if err := eng.Submit(now, Request{ID: strconv.Itoa(submitted), Tokens: prompts[submitted%len(prompts)], MaxTokens: outLen}); err != nil {
				b.Fatal(err)
			}
			submitted++
		}
		res := eng.Step(now)
		done += len(res.Completed)
		if !res.Next.IsZero() {
			now = res.Next
		}
	}
	el := time.Since(start)
	if done > 0 {
		b.ReportMetric(float64(el.Nanoseconds())/float64(done), "ns/req")
	}
	if el > 0 {
		b.ReportMetric(now.Sub(t0).Seconds()/el.Seconds(), "sim-s/s")
	}
}
