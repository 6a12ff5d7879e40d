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

// entryWorkload runs add (Predict or Record) in the benchmark loop on a
// fresh index of 8 workers, with 125-block prompts (8 KB of chat) sharing
// a 16-block prefix, after warm calls; the index's clock advances by step
// per call, and pick returns call i's prompt and worker rank.
func entryWorkload(b *testing.B, opts localrouter.IndexOptions, step time.Duration, warm int, pick func(i int) (int, int),
	add func(ix *localrouter.Index, now time.Time, key localrouter.WorkerKey, hashes []uint64)) *localrouter.Index {
	ix, err := localrouter.NewIndex(16, opts)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1000, 0)
	i := 0
	call := func() {
		p, w := pick(i)
		add(ix, now, localrouter.WorkerKey{ID: "w", DPRank: uint32(w)}, entryPrompts[p])
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
	return ix
}

const entryWorkers = 8

var entryPrompts = predictPrompts(4096, 125, 16)

// everyPrompt sends the prompts in turn, each pass over them to other
// workers.
func everyPrompt(i int) (int, int) {
	return i % len(entryPrompts), (i + i/len(entryPrompts)) % entryWorkers
}

// BenchmarkPredict: the commit's predicted entries (event mode) in steady
// state: each call adds a prompt's new blocks and expires those of the
// call a TTL before.
//
//   - steady: 10 s TTL, a call every 4 ms of the index's clock, so about
//     2,500 prompts (≈300,000 entries) are live.
//   - bound: no expiry within the run; the 2^20 bound drops the oldest
//     down to 80 % every ≈1,700 calls.
//   - refresh: every prompt predicted again while live (refreshes only).
func BenchmarkPredict(b *testing.B) {
	predict := (*localrouter.Index).Predict
	run := func(b *testing.B, ttl, step time.Duration, warm int, pick func(i int) (int, int)) {
		ix := entryWorkload(b, localrouter.IndexOptions{PredictedTTL: ttl}, step, warm, pick, predict)
		b.ReportMetric(float64(ix.PredictedStats().Entries), "entries")
	}
	b.Run("steady", func(b *testing.B) { run(b, 10*time.Second, 4*time.Millisecond, 3000, everyPrompt) })
	b.Run("bound", func(b *testing.B) { run(b, time.Hour, time.Millisecond, 8000, everyPrompt) })
	b.Run("refresh", func(b *testing.B) {
		run(b, 10*time.Second, time.Millisecond, 2000, func(i int) (int, int) { return i % 2000, i % 2000 % entryWorkers })
	})
}

// BenchmarkRecord: approximate mode's entries, as BenchmarkPredict (a
// 10 s TTL instead of 120 s, for the same number of live entries).
func BenchmarkRecord(b *testing.B) {
	record := (*localrouter.Index).Record
	run := func(b *testing.B, ttl, step time.Duration, warm int, pick func(i int) (int, int)) {
		ix := entryWorkload(b, localrouter.IndexOptions{TTL: ttl}, step, warm, pick, record)
		b.ReportMetric(float64(ix.Stats().Entries), "entries")
	}
	b.Run("steady", func(b *testing.B) { run(b, 10*time.Second, 4*time.Millisecond, 3000, everyPrompt) })
	b.Run("bound", func(b *testing.B) { run(b, time.Hour, time.Millisecond, 8000, everyPrompt) })
	b.Run("refresh", func(b *testing.B) {
		run(b, 10*time.Second, time.Millisecond, 2000, func(i int) (int, int) { return i % 2000, i % 2000 % entryWorkers })
	})
}
