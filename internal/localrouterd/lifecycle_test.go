package localrouterd

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

func TestTwoReplicasAgreeOnLoads(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	for _, useEvents := range []bool{true, false} {
		name := map[bool]string{true: "kv-events", false: "approximate"}[useEvents]
		t.Run(name, func(t *testing.T) {
			pool := "replicas-" + name
			cfg := e.config(pool)
			cfg.Router.ReplicaSync = true
			cfg.Router.UseKVEvents = useEvents
			// With KV events, the replica that placed a request counts its
			// blocks as cached on the worker for PredictedTTL (until the
			// engine's events would confirm them); the other replica does
			// not, so the two agree once that lapses: 10 s by default, the
			// most of this test's time. A short one: the same agreement,
			// reached sooner.
			cfg.Router.PredictedTTL = 500 * time.Millisecond
			cfgB := cfg
			cfgB.RouterID += "-b"
			a, ca, _ := e.start(cfg)
			b, cb, _ := e.start(cfgB)
			e.putWorker(pool, worker("w1"), 0)
			e.putWorker(pool, worker("w2"), 0)
			waitWorkers(t, a, "w1", "w2")
			waitWorkers(t, b, "w1", "w2")
			ctx := testenv.Context(t)
			p := client.TokenPrompt(seqTokens(0, 96))
			agree := func(what string) {
				t.Helper()
				testenv.Eventually(t, testTimeout, func() (string, bool) {
					la, err := ca.PotentialLoads(ctx, p)
					if err != nil {
						return err.Error(), false
					}
					lb, err := cb.PotentialLoads(ctx, p)
					if err != nil {
						return err.Error(), false
					}
					if diff := cmp.Diff(la, lb); diff != "" {
						return testenv.Errorf("%s: replica loads differ (-a +b):\n%s", what, diff)
					}
					return "", true
				})
			}
			// Requests placed on either replica.
			if _, err := ca.Commit(ctx, "r1", localrouter.WorkerKey{ID: "w1"}, p); err != nil {
				t.Fatal(err)
			}
			if _, err := cb.BestWorker(ctx, client.TokenPrompt(seqTokens(1000, 48)), client.BestWorkerOptions{RequestID: "r2"}); err != nil {
				t.Fatal(err)
			}
			agree("after add")
			if got := b.Router().Active().Stats().Requests; got != 2 {
				t.Errorf("replica b holds %d requests, want 2", got)
			}
			// Lifecycle calls on the other replica than the one that added.
			if err := cb.MarkPrefillComplete(ctx, "r1"); err != nil {
				t.Fatal(err)
			}
			agree("after prefill complete")
			if err := ca.Free(ctx, "r2"); err != nil {
				t.Fatal(err)
			}
			if err := cb.Free(ctx, "r1"); err != nil {
				t.Fatal(err)
			}
			agree("after free")
			testenv.Eventually(t, testTimeout, func() (string, bool) {
				na, nb := a.Router().Active().Stats().Requests, b.Router().Active().Stats().Requests
				if na != 0 || nb != 0 {
					return testenv.Errorf("active requests a=%d b=%d, want 0", na, nb)
				}
				return "", true
			})
			if !useEvents {
				// Replica b learnt a's commit in its approximate index.
				sel, err := cb.BestWorker(ctx, p, client.BestWorkerOptions{})
				if err != nil || sel.WorkerID != "w1" || sel.OverlapBlocks != 6 {
					t.Errorf("replica b BestWorker = %+v, %v; want w1 with overlap 6", sel, err)
				}
			}
		})
	}
}

func TestTrackLifecycle(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("track")
	cfg.Router.UseKVEvents = false
	svc, c, _ := e.start(cfg)
	e.putWorker("track", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	p := client.TokenPrompt(seqTokens(0, 64))
	load := func() localrouter.WorkerLoad { return svc.Router().Active().Load(localrouter.WorkerKey{ID: "w1"}) }
	waitIdle := func() {
		t.Helper()
		testenv.Eventually(t, testTimeout, func() (string, bool) {
			if l := load(); l.ActiveRequests != 0 {
				return testenv.Errorf("load %+v, want idle", l)
			}
			return "", true
		})
	}

	t.Run("prefill then free", func(t *testing.T) {
		tr, err := c.Track(testenv.Context(t), "t1", localrouter.WorkerKey{ID: "w1"}, p)
		if err != nil {
			t.Fatal(err)
		}
		if sel := tr.Selection(); sel.WorkerID != "w1" || sel.Address == "" || sel.RequestBlocks != 4 {
			t.Errorf("committed %+v, want w1 with an address and 4 blocks", sel)
		}
		if l := load(); l.ActiveRequests != 1 || l.PrefillTokens != 64 {
			t.Errorf("load after commit %+v, want 1 request, 64 prefill tokens", l)
		}
		if err := tr.PrefillComplete(); err != nil {
			t.Fatal(err)
		}
		if l := load(); l.ActiveRequests != 1 || l.PrefillTokens != 0 {
			t.Errorf("load after prefill %+v, want 1 request, 0 prefill tokens", l)
		}
		if err := tr.Free(); err != nil {
			t.Fatal(err)
		}
		if l := load(); l.ActiveRequests != 0 {
			t.Errorf("load after free %+v, want idle", l)
		}
		if err := tr.Free(); err != nil {
			t.Errorf("second Free: %v", err)
		}
	})
	t.Run("stream break frees", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testenv.Context(t))
		if _, err := c.Track(ctx, "t2", localrouter.WorkerKey{ID: "w1"}, p); err != nil {
			t.Fatal(err)
		}
		if l := load(); l.ActiveRequests != 1 {
			t.Fatalf("load after commit %+v, want 1 request", l)
		}
		cancel() // the caller vanishes
		waitIdle()
	})
	t.Run("attach then close frees", func(t *testing.T) {
		ctx := testenv.Context(t)
		if _, err := c.BestWorker(ctx, p, client.BestWorkerOptions{RequestID: "t3"}); err != nil {
			t.Fatal(err)
		}
		tr, err := c.Attach(ctx, "t3")
		if err != nil {
			t.Fatal(err)
		}
		tr.Close()
		waitIdle()
	})
	t.Run("client connection dies", func(t *testing.T) {
		c2, err := client.Dial(svc.GRPCAddr(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c2.Track(testenv.Context(t), "t4", localrouter.WorkerKey{ID: "w1"}, p); err != nil {
			t.Fatal(err)
		}
		c2.Close()
		waitIdle()
	})
}

func TestMetricsExposition(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("metrics")
	cfg.Router.UseKVEvents = false
	cfg.Router.ReplicaSync = false
	svc, c, reg := e.start(cfg)
	e.putWorker("metrics", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	ctx := testenv.Context(t)
	if _, err := c.Commit(ctx, "m1", localrouter.WorkerKey{ID: "w1"}, client.TokenPrompt(seqTokens(0, 40))); err != nil {
		t.Fatal(err)
	}
	names := []string{
		"kvgate_localrouter_workers", "kvgate_localrouter_ready", "kvgate_localrouter_index_blocks",
		"kvgate_localrouter_index_entries", "kvgate_localrouter_events_applied_total", "kvgate_localrouter_events_rejected_total",
		"kvgate_localrouter_event_gaps_total", "kvgate_localrouter_dumps_total", "kvgate_localrouter_requests_expired_total",
		"kvgate_localrouter_active_requests", "kvgate_localrouter_prefill_tokens", "kvgate_localrouter_active_blocks",
		"kvgate_localrouter_track_streams",
	}
	golden := filepath.Join("testdata", "metrics.golden")
	if *update {
		var b strings.Builder
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if err := writeText(&b, mfs, names); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f, names...); err != nil {
		t.Error(err)
	}
	// RPC latencies are observed per method and code.
	if n := testutil.CollectAndCount(reg, "kvgate_localrouter_rpc_duration_seconds"); n == 0 {
		t.Errorf("no kvgate_localrouter_rpc_duration_seconds series")
	}
}
