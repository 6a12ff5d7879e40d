package globalrouter_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// TestReserveNoHerdingRuns is the herding burst with probe.commit: reserve,
// 30 times over the same local routers: 64 identical long prompts (8,192
// tokens) fired at once at one global router in front of 4 idle workers
// (one pool) land 16/16/16/16 every run, no commit is contended (the
// recheck and Router.recheckMu are never reached: the decision takes no
// lock), every reservation is confirmed (none expires, none is missed),
// and the routers are idle once the leases are freed. Run it under -race:
// the reservations are the only thing that orders the burst.
func TestReserveNoHerdingRuns(t *testing.T) {
	const (
		burst = 64
		runs  = 30
	)
	for _, dl := range herdDialers {
		t.Run(dl.name, func(t *testing.T) {
			srv := pooltest.Start(t, "pool-0", 16, pooltest.Workers("p0", 4)...)
			cfg := herdConfig(srv)
			cfg.Probe.Commit = globalrouter.CommitReserve
			cfg.Probe.ReserveTTL = 10 * time.Second // no expiry on a loaded machine: it is not what is tested
			r, reg := newRouter(t, cfg, globalrouter.WithDialer(dl.d()))
			tokens := herdTokens(8192)
			for run := range runs {
				ctx := testenv.Context(t) // each run has the whole timeout
				var (
					start = make(chan struct{})
					wg    sync.WaitGroup
					mu    sync.Mutex
					got   []*globalrouter.Decision
				)
				for i := range burst {
					wg.Go(func() {
						<-start
						d, err := r.Decide(ctx, &globalrouter.Request{ID: fmt.Sprint("run", run, "-", i), Model: model, PromptTokens: tokens})
						if err != nil {
							t.Errorf("run %d: %v", run, err)
							return
						}
						mu.Lock()
						got = append(got, d)
						mu.Unlock()
					})
				}
				close(start)
				wg.Wait()
				placed := map[string]int{}
				for _, d := range got {
					placed[d.Primary.WorkerID]++
				}
				if err := srv.WaitActive(ctx, len(got)); err != nil {
					t.Errorf("run %d: %v", run, err)
				}
				for w := range 4 {
					if k := fmt.Sprintf("p0-%d", w); placed[k] != burst/4 {
						t.Errorf("run %d: %s got %d of %d, want %d (all: %v)", run, k, placed[k], burst, burst/4, placed)
					}
				}
				for _, d := range got {
					free(t, d)
				}
				if err := srv.WaitIdle(ctx); err != nil {
					t.Fatalf("run %d, after the leases were freed: %v", run, err)
				}
				if t.Failed() {
					return
				}
			}
			if n := countByLabel(t, reg, "kvgate_globalrouter_contended_commits_total", "pool", "pool-0"); n != 0 {
				t.Errorf("%v contended commits, want 0", n)
			}
			rs := srv.Router.ReservationStats()
			if rs.Made != burst*runs || rs.Confirmed != burst*runs || rs.Expired != 0 || rs.Missed != 0 || rs.Held != 0 {
				t.Errorf("reservations: %+v, want %d made and confirmed, none held, expired or missed", rs, burst*runs)
			}
		})
	}
}

// TestReserveReleasesLosers: over two pools every probe reserves, the
// losing pool's reservation is released once the decision is made (not
// left to its TTL), and the winner's is confirmed: after a sequence of
// decisions nothing is held on either router but the requests themselves.
func TestReserveReleasesLosers(t *testing.T) {
	for _, dl := range herdDialers {
		t.Run(dl.name, func(t *testing.T) {
			ctx := testenv.Context(t)
			a := pooltest.Start(t, "pool-0", 16, pooltest.Workers("p0", 2)...)
			b := pooltest.Start(t, "pool-1", 16, pooltest.Workers("p1", 2)...)
			tokens := herdTokens(2048)
			a.Store(t, "p0-1", tokens) // pool-0 ranks first: it holds the prompt
			cfg := herdConfig(a, b)
			cfg.Probe.Commit = globalrouter.CommitReserve
			cfg.Probe.ReserveTTL = 10 * time.Second // a release, not the TTL, must drop them
			r, reg := newRouter(t, cfg, globalrouter.WithDialer(dl.d()))
			var held []*globalrouter.Decision
			for i := range 4 {
				d, err := r.Decide(ctx, &globalrouter.Request{ID: fmt.Sprint("rel-", i), Model: model, PromptTokens: tokens, Explain: true})
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(d.Explanation, "decide-and-commit") {
					t.Errorf("decision %d decided and committed in reserve mode: %s", i, d.Explanation)
				}
				held = append(held, d)
				// The losing pool's release is not waited for by the
				// decision; a unary one may still be on its way when the
				// next decision probes, which would then find it held and
				// be contended (reserve.go). Sequential decisions wait for
				// it here.
				for _, s := range []*pooltest.Server{a, b} {
					if err := s.WaitNoReservations(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			on := map[string]int{}
			for _, d := range held {
				on[d.Primary.Pool]++
			}
			if err := a.WaitActive(ctx, on["pool-0"]); err != nil {
				t.Error(err)
			}
			if err := b.WaitActive(ctx, on["pool-1"]); err != nil {
				t.Error(err)
			}
			for _, s := range []*pooltest.Server{a, b} {
				rs := s.Router.ReservationStats()
				if rs.Made != 4 || rs.Held != 0 || rs.Expired != 0 || rs.Confirmed+rs.Released != 4 {
					t.Errorf("%s reservations: %+v, want 4 made, each confirmed or released, none held or expired", s.Addr, rs)
				}
			}
			released := countByLabel(t, reg, "kvgate_globalrouter_reservations_released_total", "pool", "pool-0") +
				countByLabel(t, reg, "kvgate_globalrouter_reservations_released_total", "pool", "pool-1")
			if released != 4 {
				t.Errorf("global router released %v reservations, want 4 (one loser per decision)", released)
			}
			for _, d := range held {
				free(t, d)
			}
			for _, s := range []*pooltest.Server{a, b} {
				if err := s.WaitIdle(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
