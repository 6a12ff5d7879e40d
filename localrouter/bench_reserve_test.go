package localrouter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/localrouter"
)

// BenchmarkReserveProbe is the local router's side of one sequential
// decision of globalrouter's BenchmarkDecideModes, without the transport:
// 8 workers, block size 16, 512-block prompts sharing their first 500
// blocks with a request committed on one worker and freed (its blocks in
// the index, none active). "probe" is a plain probe;
// "reserve-release" a reserving probe and its release (the losing pool);
// "reserve-confirm" a reserving probe, its answerless confirmation and
// the request's free (the winning pool), with the probe alone timed too
// (probe-ns/op: what a decision waits for).
func BenchmarkReserveProbe(b *testing.B) {
	cfg := localrouter.DefaultConfig()
	cfg.BlockSize = 16
	r, err := localrouter.New(cfg, localrouter.Options{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	for i := range 8 {
		r.AddWorker(fmt.Sprint("w-", i), 1)
	}
	ctx := context.Background()
	prompts := predictPrompts(64, 512, 500)
	if _, err := r.Commit(ctx, "resident", localrouter.WorkerKey{ID: "w-3"}, localrouter.Request{LocalHashes: prompts[0], BlockSize: 16}); err != nil {
		b.Fatal(err)
	}
	// Freed, as the decision benchmark frees each decision before the
	// next: the index keeps its blocks, no request is active.
	if err := r.Free(ctx, "resident"); err != nil {
		b.Fatal(err)
	}
	req := func(i int) localrouter.Request {
		return localrouter.Request{LocalHashes: prompts[1+i%(len(prompts)-1)], BlockSize: 16}
	}
	b.Run("probe", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := r.BestWorker(ctx, req(i), localrouter.BestWorkerOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reserve-release", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := r.BestWorker(ctx, req(i), localrouter.BestWorkerOptions{RequestID: "x", ReserveTTL: time.Second}); err != nil {
				b.Fatal(err)
			}
			if err := r.Release(ctx, "x"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reserve-confirm", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		var probe time.Duration // the reserving probe alone: what the decision waits for
		for b.Loop() {
			i++
			t0 := time.Now()
			sel, err := r.BestWorker(ctx, req(i), localrouter.BestWorkerOptions{RequestID: "x", ReserveTTL: time.Second})
			probe += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.ConfirmHeld(ctx, "x", localrouter.WorkerKey{ID: sel.WorkerID, DPRank: sel.DPRank}); err != nil {
				b.Fatal(err)
			}
			if err := r.Free(ctx, "x"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(probe.Nanoseconds())/float64(i), "probe-ns/op")
	})
}
