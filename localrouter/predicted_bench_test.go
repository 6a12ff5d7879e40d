package localrouter_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvgate/kvgate/localrouter"
)

// predictPrompts returns n prompts of blocks local hashes each, sharing
// their first shared blocks (a chat's system prompt), the rest their own.
func predictPrompts(n, blocks, shared int) [][]uint64 {
	rng := rand.New(rand.NewPCG(1, 2))
	prefix := make([]uint64, shared)
	for i := range prefix {
		prefix[i] = rng.Uint64()
	}
	out := make([][]uint64, n)
	for i := range out {
		p := append(make([]uint64, 0, blocks), prefix...)
		for len(p) < blocks {
			p = append(p, rng.Uint64())
		}
		out[i] = p
	}
	return out
}

// BenchmarkPredict: the commit's predicted entries on an event-mode index
// of 8 workers, 125-block prompts (8 KB of chat) sharing a 16-block
// prefix, in steady state: each call adds a prompt's new blocks and
// expires those of the call a TTL before.
//
//   - steady: 10 s TTL, a call every 4 ms of the index's clock, so about
//     2,500 prompts (≈300,000 entries) are live.
//   - bound: no expiry within the run; the 2^20 bound drops the oldest
//     down to 80 % every ≈1,700 calls.
//   - refresh: every prompt predicted again while live (refreshes only).
func BenchmarkPredict(b *testing.B) {
	const blocks, shared, workers = 125, 16, 8
	prompts := predictPrompts(4096, blocks, shared)
	// pick returns call i's prompt and worker rank.
	run := func(b *testing.B, ttl, step time.Duration, warm int, pick func(i int) (int, int)) {
		ix, err := localrouter.NewIndex(16, localrouter.IndexOptions{PredictedTTL: ttl})
		if err != nil {
			b.Fatal(err)
		}
		now := time.Unix(1000, 0)
		i := 0
		call := func() {
			p, w := pick(i)
			ix.Predict(now, localrouter.WorkerKey{ID: "w", DPRank: uint32(w)}, prompts[p])
			now = now.Add(step)
			i++
		}
		for range warm {
			call()
		}
		b.ReportAllocs()
		for b.Loop() {
			call()
		}
		b.ReportMetric(float64(ix.PredictedStats().Entries), "entries")
	}
	// Each pass over the prompts sends each to another worker.
	all := func(i int) (int, int) { return i % len(prompts), (i + i/len(prompts)) % workers }
	b.Run("steady", func(b *testing.B) { run(b, 10*time.Second, 4*time.Millisecond, 3000, all) })
	b.Run("bound", func(b *testing.B) { run(b, time.Hour, time.Millisecond, 8000, all) })
	b.Run("refresh", func(b *testing.B) {
		run(b, 10*time.Second, time.Millisecond, 2000, func(i int) (int, int) { return i % 2000, i % 2000 % workers })
	})
}
