package localrouter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvevents"
)

// The benchmark workload follows peer-figures.md: prompts of 512 blocks of
// 16 tokens, in 40 families over 4 shared system prompts; a family shares a
// prefix of 32–480 blocks; 10 % of prompts are unique. Each prompt is
// stored on one or two of 64 workers.
const (
	benchBS       = 16
	benchBlocks   = 512
	benchWorkers  = 64
	benchFamilies = 40
)

type benchPrompt struct {
	local  []uint64
	blocks []kvevents.Block
}

type benchWorld struct {
	prompts []benchPrompt
	ix      *Index
	entries int
	nodes   int
	bytes   uint64
}

var (
	worldOnce sync.Once
	world     *benchWorld
)

func makePrompts(n int, rng *rand.Rand) []benchPrompt {
	sys := make([][]uint32, 4)
	for i := range sys {
		sys[i] = randTokens(rng, 32*benchBS)
	}
	type family struct{ prefix []uint32 }
	fams := make([]family, benchFamilies)
	for i := range fams {
		shared := 32 + rng.IntN(449)
		p := append([]uint32(nil), sys[i%4]...)
		p = append(p, randTokens(rng, (shared-32)*benchBS)...)
		fams[i] = family{p}
	}
	out := make([]benchPrompt, n)
	for i := range out {
		var toks []uint32
		if rng.IntN(10) == 0 {
			toks = randTokens(rng, benchBlocks*benchBS)
		} else {
			f := fams[rng.IntN(benchFamilies)]
			toks = append(append([]uint32(nil), f.prefix...), randTokens(rng, benchBlocks*benchBS-len(f.prefix))...)
		}
		local, _ := kvevents.LocalHashes(toks, benchBS, "")
		blocks := make([]kvevents.Block, benchBlocks)
		for j := range blocks {
			blocks[j] = kvevents.Block{EngineHash: rng.Uint64(), TokenIDs: toks[j*benchBS : (j+1)*benchBS]}
		}
		out[i] = benchPrompt{local, blocks}
	}
	return out
}

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(150000))
	}
	return t
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// getWorld builds an index of ≈1M (block, worker) entries once.
func getWorld(b *testing.B) *benchWorld {
	worldOnce.Do(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		w := &benchWorld{prompts: makePrompts(1600, rng)}
		// Drop token ids from the heap measurement: keep only hashes.
		before := heap()
		ix, _ := NewIndex(benchBS, IndexOptions{})
		for i, p := range w.prompts {
			for c := 0; c < 1+i%2; c++ {
				worker := fmt.Sprintf("w%02d", (i*7+c*13)%benchWorkers)
				ev := kvevents.RouterEvent{WorkerID: worker, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: p.blocks}}}
				if err := ix.Apply(ev); err != nil {
					panic(err)
				}
			}
		}
		w.bytes = heap() - before
		w.ix = ix
		st := ix.Stats()
		w.entries, w.nodes = st.Entries, st.Nodes
		world = w
	})
	return world
}

// percentiles runs f n times and reports p50 and p99 per call.
func percentiles(b *testing.B, f func(i int)) {
	durs := make([]time.Duration, 0, b.N)
	i := 0
	for b.Loop() {
		t0 := time.Now()
		f(i)
		durs = append(durs, time.Since(t0))
		i++
	}
	slices.Sort(durs)
	if len(durs) > 0 {
		b.ReportMetric(float64(durs[len(durs)/2].Nanoseconds())/1e3, "p50-µs")
		b.ReportMetric(float64(durs[len(durs)*99/100].Nanoseconds())/1e3, "p99-µs")
	}
}

func BenchmarkFindMatches(b *testing.B) {
	w := getWorld(b)
	b.Logf("index: %d nodes, %d (block, worker) entries, %.1f B/entry", w.nodes, w.entries, float64(w.bytes)/float64(w.entries))
	miss := make([]uint64, benchBlocks)
	for i := range miss {
		miss[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	b.Run("hit-512", func(b *testing.B) {
		var m Matches
		b.ReportAllocs()
		percentiles(b, func(i int) { w.ix.FindMatches(w.prompts[(i*31)%len(w.prompts)].local, &m) })
	})
	b.Run("miss-512", func(b *testing.B) {
		var m Matches
		b.ReportAllocs()
		percentiles(b, func(int) { w.ix.FindMatches(miss, &m) })
	})
	b.Run("hit-512-concurrent-writer", func(b *testing.B) {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // a writer storing and removing a chain in a loop
			defer close(done)
			p := w.prompts[0]
			rm := make([]uint64, len(p.blocks))
			for i, blk := range p.blocks {
				rm[i] = blk.EngineHash
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				w.ix.Apply(kvevents.RouterEvent{WorkerID: "writer", Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: p.blocks}}})
				w.ix.Apply(kvevents.RouterEvent{WorkerID: "writer", Event: kvevents.Event{Removed: &kvevents.Removed{EngineHashes: rm}}})
			}
		}()
		var m Matches
		b.ReportAllocs()
		percentiles(b, func(i int) { w.ix.FindMatches(w.prompts[(i*31)%len(w.prompts)].local, &m) })
		close(stop)
		<-done
	})
}

func BenchmarkIndexMemory(b *testing.B) {
	w := getWorld(b)
	for b.Loop() {
	}
	b.ReportMetric(float64(w.bytes)/float64(w.entries), "B/entry")
	b.ReportMetric(float64(w.entries), "entries")
	b.ReportMetric(float64(w.nodes), "nodes")
}

func BenchmarkApplyStored(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	prompts := makePrompts(400, rng)
	var ix *Index
	b.ReportAllocs()
	i := 0
	blocks := 0
	for b.Loop() {
		if i%len(prompts) == 0 {
			b.StopTimer()
			ix, _ = NewIndex(benchBS, IndexOptions{})
			b.StartTimer()
		}
		p := prompts[i%len(prompts)]
		ix.Apply(kvevents.RouterEvent{WorkerID: fmt.Sprintf("w%02d", i%benchWorkers), Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: p.blocks}}})
		blocks += len(p.blocks)
		i++
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkBestWorker: 64 workers, 200 active requests, the ≈1M-entry index,
// a 512-block request given as hashes (as the global router sends them) and
// as tokens.
func BenchmarkBestWorker(b *testing.B) {
	w := getWorld(b)
	cfg := DefaultConfig()
	r, _ := New(cfg, Options{SweepInterval: -1})
	defer r.Close()
	r.index = w.ix
	for i := 0; i < benchWorkers; i++ {
		r.AddWorker(fmt.Sprintf("w%02d", i), 1)
	}
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		p := w.prompts[(i*13)%len(w.prompts)]
		if _, err := r.BestWorker(ctx, Request{LocalHashes: p.local, BlockSize: benchBS}, BestWorkerOptions{RequestID: fmt.Sprint("active-", i)}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("hashes", func(b *testing.B) {
		b.ReportAllocs()
		percentiles(b, func(i int) {
			p := w.prompts[(i*31)%len(w.prompts)]
			if _, err := r.BestWorker(ctx, Request{LocalHashes: p.local, BlockSize: benchBS}, BestWorkerOptions{}); err != nil {
				b.Fatal(err)
			}
		})
	})
	toks := make([][]uint32, 64)
	for i := range toks {
		p := w.prompts[(i*31)%len(w.prompts)]
		for _, blk := range p.blocks {
			toks[i] = append(toks[i], blk.TokenIDs...)
		}
	}
	b.Run("tokens", func(b *testing.B) {
		b.ReportAllocs()
		percentiles(b, func(i int) {
			if _, err := r.BestWorker(ctx, Request{Tokens: toks[i%len(toks)]}, BestWorkerOptions{}); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("add-free", func(b *testing.B) {
		b.ReportAllocs()
		percentiles(b, func(i int) {
			p := w.prompts[(i*31)%len(w.prompts)]
			if _, err := r.BestWorker(ctx, Request{LocalHashes: p.local, BlockSize: benchBS}, BestWorkerOptions{RequestID: "x"}); err != nil {
				b.Fatal(err)
			}
			r.Free(ctx, "x")
		})
	})
}
