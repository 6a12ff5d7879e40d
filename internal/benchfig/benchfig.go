// Package benchfig builds the local router's benchmark workload and measures
// the figures BENCHMARKS.md tracks: FindMatches latency on a ≈1M-entry
// index, event apply throughput, index bytes per (block, worker) entry and
// BestWorker latency. The Go benchmarks in localrouter and `kvgate bench`
// share it, so both measure the same thing.
//
// The workload follows shared/reference/peer-figures.md: prompts of 512
// blocks of 16 tokens in 40 families over 4 shared system prompts; a family
// shares a prefix of 32–480 blocks; 10 % of prompts are unique. Prompt i is
// stored on one or two of 64 workers.
package benchfig

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
)

// Workload sizes.
const (
	BlockSize = 16
	Blocks    = 512
	Workers   = 64
	Families  = 40
	// Prompts stored in the index: ≈1M (block, worker) entries.
	Prompts = 1600
	// ActiveRequests in flight for the BestWorker figure.
	ActiveRequests = 200
)

// Prompt is one benchmark prompt: its local hashes and its blocks as a
// Stored event would carry them.
type Prompt struct {
	Local  []uint64
	Blocks []kvevents.Block
	Tokens []uint32
}

// MakePrompts returns n prompts, deterministic in seed.
func MakePrompts(n int, seed uint64) []Prompt {
	rng := rand.New(rand.NewPCG(seed, seed))
	sys := make([][]uint32, 4)
	for i := range sys {
		sys[i] = randTokens(rng, 32*BlockSize)
	}
	fams := make([][]uint32, Families)
	for i := range fams {
		shared := 32 + rng.IntN(449)
		p := append([]uint32(nil), sys[i%4]...)
		fams[i] = append(p, randTokens(rng, (shared-32)*BlockSize)...)
	}
	out := make([]Prompt, n)
	for i := range out {
		var toks []uint32
		if rng.IntN(10) == 0 {
			toks = randTokens(rng, Blocks*BlockSize)
		} else {
			f := fams[rng.IntN(Families)]
			toks = append(append([]uint32(nil), f...), randTokens(rng, Blocks*BlockSize-len(f))...)
		}
		local, _ := kvevents.LocalHashes(toks, BlockSize, "")
		blocks := make([]kvevents.Block, Blocks)
		for j := range blocks {
			blocks[j] = kvevents.Block{EngineHash: rng.Uint64(), TokenIDs: toks[j*BlockSize : (j+1)*BlockSize]}
		}
		out[i] = Prompt{Local: local, Blocks: blocks, Tokens: toks}
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

// WorkerName is the id of benchmark worker i.
func WorkerName(i int) string { return fmt.Sprintf("w%02d", i%Workers) }

// StoredEvent is prompt p stored on worker w.
func StoredEvent(w string, p Prompt) kvevents.RouterEvent {
	return kvevents.RouterEvent{WorkerID: w, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: p.Blocks}}}
}

// World is a router with the workload's index and active requests.
type World struct {
	Prompts []Prompt
	Router  *localrouter.Router
	// BytesPerEntry is the heap the index took per (block, worker) entry.
	BytesPerEntry float64
	Stats         localrouter.IndexStats
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BuildWorld stores the workload's prompts in a fresh router (64 workers)
// and measures the index's memory. Close the router when done.
func BuildWorld() (*World, error) {
	prompts := MakePrompts(Prompts, 7)
	r, err := localrouter.New(localrouter.DefaultConfig(), localrouter.Options{SweepInterval: -1})
	if err != nil {
		return nil, err
	}
	for i := 0; i < Workers; i++ {
		r.AddWorker(WorkerName(i), 1)
	}
	before := heapAlloc()
	for i, p := range prompts {
		for c := 0; c < 1+i%2; c++ {
			if err := r.ApplyEvent(StoredEvent(WorkerName(i*7+c*13), p)); err != nil {
				r.Close()
				return nil, err
			}
		}
	}
	after := heapAlloc()
	st := r.Index().Stats()
	return &World{Prompts: prompts, Router: r, BytesPerEntry: float64(after-before) / float64(st.Entries), Stats: st}, nil
}

// AddActive records ActiveRequests requests in flight.
func (w *World) AddActive(ctx context.Context) error {
	for i := 0; i < ActiveRequests; i++ {
		p := w.Prompts[(i*13)%len(w.Prompts)]
		if _, err := w.Router.BestWorker(ctx, localrouter.Request{LocalHashes: p.Local, BlockSize: BlockSize},
			localrouter.BestWorkerOptions{RequestID: fmt.Sprint("active-", i)}); err != nil {
			return err
		}
	}
	return nil
}

// Latency holds per-call percentiles.
type Latency struct {
	P50, P99 time.Duration
	N        int
}

// Measure calls f n times and returns the percentiles of one call.
func Measure(n int, f func(i int)) Latency {
	durs := make([]time.Duration, n)
	for i := range durs {
		t0 := time.Now()
		f(i)
		durs[i] = time.Since(t0)
	}
	return Percentiles(durs)
}

// Percentiles sorts durs and returns their p50 and p99.
func Percentiles(durs []time.Duration) Latency {
	if len(durs) == 0 {
		return Latency{}
	}
	slices.Sort(durs)
	return Latency{P50: durs[len(durs)/2], P99: durs[len(durs)*99/100], N: len(durs)}
}

// ApplyThroughput applies Stored events of the workload's prompts to fresh
// indexes for at least d and returns stored blocks per second.
func ApplyThroughput(prompts []Prompt, d time.Duration) float64 {
	var blocks int
	var spent time.Duration
	for spent < d {
		ix, _ := localrouter.NewIndex(BlockSize, localrouter.IndexOptions{})
		t0 := time.Now()
		for i, p := range prompts {
			ix.Apply(StoredEvent(WorkerName(i), p))
			blocks += len(p.Blocks)
		}
		spent += time.Since(t0)
	}
	return float64(blocks) / spent.Seconds()
}
