package localrouter_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/benchfig"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/lib/timing"
	"github.com/kvgate/kvgate/localrouter"
)

var (
	worldOnce sync.Once
	world     *benchfig.World
	worldErr  error
)

// getWorld builds the ≈1M-entry index of benchfig once per test binary.
func getWorld(b *testing.B) *benchfig.World {
	worldOnce.Do(func() {
		world, worldErr = benchfig.BuildWorld()
		if worldErr == nil {
			worldErr = world.AddActive(context.Background())
		}
	})
	if worldErr != nil {
		b.Fatal(worldErr)
	}
	return world
}

// percentiles runs f in the benchmark loop and reports p50/p99 per call.
func percentiles(b *testing.B, f func(i int)) {
	durs := make([]time.Duration, 0, b.N)
	i := 0
	for b.Loop() {
		t0 := time.Now()
		f(i)
		durs = append(durs, time.Since(t0))
		i++
	}
	lat := benchfig.Percentiles(durs)
	b.ReportMetric(float64(lat.P50.Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat.P99.Nanoseconds())/1e3, "p99-µs")
}

func BenchmarkFindMatches(b *testing.B) {
	w := getWorld(b)
	ix := w.Router.Index()
	b.Logf("index: %d nodes, %d (block, worker) entries, %.1f B/entry", w.Stats.Nodes, w.Stats.Entries, w.BytesPerEntry)
	miss := make([]uint64, benchfig.Blocks)
	for i := range miss {
		miss[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	b.Run("hit-512", func(b *testing.B) {
		var m localrouter.Matches
		b.ReportAllocs()
		percentiles(b, func(i int) { ix.FindMatches(w.Prompts[(i*31)%len(w.Prompts)].Local, &m) })
	})
	b.Run("miss-512", func(b *testing.B) {
		var m localrouter.Matches
		b.ReportAllocs()
		percentiles(b, func(int) { ix.FindMatches(miss, &m) })
	})
	b.Run("hit-512-concurrent-writer", func(b *testing.B) {
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { // a writer storing and removing a 512-block chain in a loop
			defer close(done)
			p := w.Prompts[0]
			rm := make([]uint64, len(p.Blocks))
			for i, blk := range p.Blocks {
				rm[i] = blk.EngineHash
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				ix.Apply(benchfig.StoredEvent("writer", p))
				ix.Apply(kvevents.RouterEvent{WorkerID: "writer", Event: kvevents.Event{Removed: &kvevents.Removed{EngineHashes: rm}}})
			}
		}()
		var m localrouter.Matches
		b.ReportAllocs()
		percentiles(b, func(i int) { ix.FindMatches(w.Prompts[(i*31)%len(w.Prompts)].Local, &m) })
		close(stop)
		<-done
	})
}

func BenchmarkIndexMemory(b *testing.B) {
	w := getWorld(b)
	for b.Loop() {
	}
	b.ReportMetric(w.BytesPerEntry, "B/entry")
	b.ReportMetric(float64(w.Stats.Entries), "entries")
	b.ReportMetric(float64(w.Stats.Nodes), "nodes")
}

func BenchmarkApplyStored(b *testing.B) {
	prompts := benchfig.MakePrompts(400, 3)
	var ix *localrouter.Index
	b.ReportAllocs()
	i, blocks := 0, 0
	for b.Loop() {
		if i%len(prompts) == 0 {
			b.StopTimer()
			ix, _ = localrouter.NewIndex(benchfig.BlockSize, localrouter.IndexOptions{})
			b.StartTimer()
		}
		p := prompts[i%len(prompts)]
		ix.Apply(benchfig.StoredEvent(benchfig.WorkerName(i), p))
		blocks += len(p.Blocks)
		i++
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkBestWorker: 64 workers, 200 active requests, the ≈1M-entry
// index, a 512-block request given as hashes (as the global router sends
// them) and as tokens; and a recorded request added then freed.
func BenchmarkBestWorker(b *testing.B) {
	w := getWorld(b)
	r := w.Router
	ctx := context.Background()
	b.Run("hashes", func(b *testing.B) {
		b.ReportAllocs()
		percentiles(b, func(i int) {
			p := w.Prompts[(i*31)%len(w.Prompts)]
			if _, err := r.BestWorker(ctx, localrouter.Request{LocalHashes: p.Local, BlockSize: benchfig.BlockSize}, localrouter.BestWorkerOptions{}); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("tokens", func(b *testing.B) {
		b.ReportAllocs()
		percentiles(b, func(i int) {
			p := w.Prompts[(i*31)%len(w.Prompts)]
			if _, err := r.BestWorker(ctx, localrouter.Request{Tokens: p.Tokens}, localrouter.BestWorkerOptions{}); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("add-free", func(b *testing.B) {
		b.ReportAllocs()
		percentiles(b, func(i int) {
			p := w.Prompts[(i*31)%len(w.Prompts)]
			if _, err := r.BestWorker(ctx, localrouter.Request{LocalHashes: p.Local, BlockSize: benchfig.BlockSize}, localrouter.BestWorkerOptions{RequestID: "x"}); err != nil {
				b.Fatal(err)
			}
			r.Free(ctx, "x")
		})
	})
}

// BenchmarkIndexGC times one full collection (runtime.GC) with the
// ≈1M-entry benchfig world live: its index, active requests and prompts.
// Most of the mark work is the index's, so this is what its pointers cost
// the collector on every cycle (µs/GC); heap-MB and objects say what was
// live.
func BenchmarkIndexGC(b *testing.B) {
	w := getWorld(b)
	runtime.GC()
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/GC")
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b.ReportMetric(float64(m.HeapAlloc)/(1<<20), "heap-MB")
	b.ReportMetric(float64(m.HeapObjects), "objects")
	runtime.KeepAlive(w)
}

// BenchmarkTTFTCalibration prices the ttft scorer's calibration in one run:
// "probe" is a state-free BestWorker over 64 workers whose timing models
// are the configured curves (static: Config.Calibrate false) or their own
// (per-rank models, pinned here as a fit would publish them: the same
// lookup); "placed" is a whole placement, BestWorker with a request id,
// MarkPrefillComplete and Free, without and with the online fit taking
// its sample (calib.go).
func BenchmarkTTFTCalibration(b *testing.B) {
	const workers = 64
	newRouter := func(b *testing.B, calibrate, perRank bool) (*localrouter.Router, *time.Time) {
		now := time.Unix(1000, 0)
		cfg := localrouter.DefaultConfig()
		cfg.Calibrate = calibrate
		r, err := localrouter.New(cfg, localrouter.Options{Clock: func() time.Time { return now }, SweepInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = r.Close() })
		for w := range workers {
			id := fmt.Sprintf("w%02d", w)
			r.AddWorker(id, 1)
			if perRank {
				m := localrouter.TimingModelOf(timing.PrefillMillis, timing.DecodeMillis, localrouter.DefaultTTFTChunk)
				m.PrefillLinear *= 1 + float64(w)/workers
				if err := r.PinTiming(localrouter.WorkerKey{ID: id}, m); err != nil {
					b.Fatal(err)
				}
			}
		}
		return r, &now
	}
	hashes := make([][]uint64, 256)
	for i := range hashes {
		hashes[i] = make([]uint64, 64)
		for k := range hashes[i] {
			hashes[i][k] = uint64(i)<<32 | uint64(k) + 1
		}
	}
	ctx := context.Background()
	for _, mode := range []struct {
		name               string
		calibrate, perRank bool
	}{{"static", false, false}, {"calibrated", true, true}} {
		b.Run("probe/"+mode.name, func(b *testing.B) {
			r, _ := newRouter(b, mode.calibrate, mode.perRank)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := r.BestWorker(ctx, localrouter.Request{LocalHashes: hashes[i%len(hashes)], BlockSize: 16}, localrouter.BestWorkerOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, mode := range []struct {
		name      string
		calibrate bool
	}{{"static", false}, {"calibrating", true}} {
		b.Run("placed/"+mode.name, func(b *testing.B) {
			r, now := newRouter(b, mode.calibrate, false)
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = fmt.Sprint("r", i)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				id := ids[i%len(ids)]
				if _, err := r.BestWorker(ctx, localrouter.Request{LocalHashes: hashes[i%len(hashes)], BlockSize: 16}, localrouter.BestWorkerOptions{RequestID: id}); err != nil {
					b.Fatal(err)
				}
				*now = now.Add(50 * time.Millisecond)
				if err := r.MarkPrefillComplete(ctx, id); err != nil {
					b.Fatal(err)
				}
				if err := r.Free(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
