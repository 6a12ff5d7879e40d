package globalrouter_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// bestEffortOutcome is kvgate_globalrouter_best_effort_outcomes_total of
// poolName and outcome (0 when never counted).
func bestEffortOutcome(t *testing.T, reg *prometheus.Registry, poolName, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_globalrouter_best_effort_outcomes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["pool"] == poolName && got["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestBestEffortCommittedLate (issue 27 item 4): a decision made best
// effort while the pool's only router is down is committed on that router
// as soon as it answers again, and freed there when the request ends; a
// best-effort request that ended while the router was still down leaves
// nothing behind. Each outcome is counted.
func TestBestEffortCommittedLate(t *testing.T) {
	ctx := testenv.Context(t)
	workers := pooltest.Workers("a", 2)
	srv := pooltest.Start(t, "pool-a", 16, workers...)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, srv.Addr))
	cfg.Probe.Timeout = 10 * time.Second
	r, reg := newRouter(t, cfg)
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(50)})
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	srv.Stop()

	ended, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(60)})
	if err != nil || !ended.BestEffort {
		t.Fatalf("Decide with the router down: %+v, %v; want a best-effort decision", ended, err)
	}
	free(t, ended)
	if got := bestEffortOutcome(t, reg, "pool-a", "ended"); got != 1 {
		t.Errorf("a best-effort request that ended before the router came back: ended = %v, want 1", got)
	}
	kept, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(70)})
	if err != nil || !kept.BestEffort {
		t.Fatalf("Decide with the router down: %+v, %v; want a best-effort decision", kept, err)
	}
	if n := r.Leases(); n != 1 {
		t.Errorf("Leases = %d with one best-effort request in flight, want 1", n)
	}
	if err := kept.Lease.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete of a best-effort decision: %v", err)
	}

	back := pooltest.StartOn(t, srv.Addr, "pool-a", 16, workers...)
	if err := back.WaitActive(ctx, 1); err != nil {
		t.Fatalf("the router back: %v; want the best-effort request committed on it", err)
	}
	testenv.Eventually(t, 10*time.Second, func() (string, bool) {
		if got := bestEffortOutcome(t, reg, "pool-a", "late_committed"); got != 1 {
			return testenv.Errorf("late_committed = %v, want 1", got)
		}
		return "", true
	})
	free(t, kept)
	if err := back.WaitIdle(ctx); err != nil {
		t.Errorf("after the best-effort request ended: %v", err)
	}
	if n := r.Leases(); n != 0 {
		t.Errorf("Leases = %d after every request ended, want 0", n)
	}
	if got := bestEffortOutcome(t, reg, "pool-a", "dropped"); got != 0 {
		t.Errorf("dropped = %v, want 0", got)
	}
}

// TestBestEffortMovesToServedWorker (issue 27): a best-effort request the
// data plane served from a fallback (the primary refused the connection)
// is accounted on the worker that served it, not on the primary: while its
// late commit is still queued the commit is retargeted; once it was sent
// the request is committed late on the fallback and freed on the primary.
func TestBestEffortMovesToServedWorker(t *testing.T) {
	for _, sentFirst := range []bool{false, true} {
		name := "queued"
		if sentFirst {
			name = "sent"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testenv.Context(t)
			workers := pooltest.Workers("a", 2)
			srv := pooltest.Start(t, "pool-a", 16, workers...)
			cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-a", 16, []string{model}, srv.Addr))
			cfg.Probe.Timeout = 10 * time.Second
			r, reg := newRouter(t, cfg)
			// Both workers known from decisions while the router was up.
			testenv.Eventually(t, 20*time.Second, func() (string, bool) {
				d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(50)})
				if err != nil {
					t.Fatal(err)
				}
				free(t, d)
				return "no same-pool fallback known yet", len(d.Fallbacks) > 0
			})
			if err := srv.WaitIdle(ctx); err != nil {
				t.Fatal(err)
			}
			srv.Stop()
			d, err := r.Decide(ctx, &globalrouter.Request{ID: "req-be", Model: model, Prompt: longText(70)})
			if err != nil || !d.BestEffort || len(d.Fallbacks) == 0 {
				t.Fatalf("Decide with the router down: %+v, %v; want a best-effort decision with a fallback", d, err)
			}
			served := d.Fallbacks[0]
			if served.WorkerID == d.Primary.WorkerID {
				t.Fatalf("fallback %s is the primary", served.WorkerID)
			}
			back := pooltest.StartOn(t, srv.Addr, "pool-a", 16, workers...)
			id := "req-be"
			if sentFirst {
				if err := back.WaitActive(ctx, 1); err != nil {
					t.Fatalf("the late commit on the router back: %v", err)
				}
				id += "~served"
			}
			m, ok := d.Lease.(globalrouter.Mover)
			if !ok {
				t.Fatal("a best-effort decision's lease is not a Mover")
			}
			if err := m.Move(ctx, served); err != nil {
				t.Fatalf("Move to the served fallback: %v", err)
			}
			testenv.Eventually(t, 20*time.Second, func() (string, bool) {
				k, ok := back.Router.Active().Has(id)
				if !ok || k.ID != served.WorkerID || back.ActiveRequests() != 1 {
					return testenv.Errorf("request %s on %v (%v), %d active; want it on the served worker %s alone", id, k, ok, back.ActiveRequests(), served.WorkerID)
				}
				return "", true
			})
			if err := d.Lease.PrefillComplete(ctx); err != nil {
				t.Errorf("PrefillComplete after the move: %v", err)
			}
			free(t, d)
			if err := back.WaitIdle(ctx); err != nil {
				t.Errorf("after the moved best-effort request ended: %v", err)
			}
			if n := r.Leases(); n != 0 {
				t.Errorf("Leases = %d after the request ended, want 0", n)
			}
			if got := bestEffortOutcome(t, reg, "pool-a", "dropped"); got != 0 {
				t.Errorf("dropped = %v, want 0", got)
			}
		})
	}
}
