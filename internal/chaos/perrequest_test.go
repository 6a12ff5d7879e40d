package chaos

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/localrouter"
)

// TestRecorderJoins: the parts' observations, in any order, join into one
// record per request (router id, client id, engine id), and the report
// gives each request's lags, the one-sided ones, the doubles and the
// window check at the samples.
func TestRecorderJoins(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rec := newRecorder()
	obs := rec.observers()
	router, engine := obs.Router("p"), obs.Engine("p", "w0")
	k := localrouter.WorkerKey{ID: "w0"}
	d := &globalrouter.Decision{}

	// r1: committed at 0, decided at 10, admitted at 100, finished at 600,
	// lease freed at 650, router free at 700.
	router.Added("r1", k, at(0))
	obs.Decisions(globalrouter.Observation{Time: at(0), Duration: 10 * time.Millisecond, RequestID: "r1", ClientID: "c1", Decision: d})
	engine.Admitted(0, "m1", "c1", at(100))
	engine.Left(0, "m1", at(600), "length")
	obs.Freed("r1", at(650))
	router.Removed("r1", k, at(700))
	// r2: the engine first (a best-effort decision's late commit), moved
	// to the fallback that served it (two entries at once for 5 ms), and
	// the router's free 1.5 s after the engine's finish.
	engine.Admitted(0, "m2", "c2", at(50))
	obs.Decisions(globalrouter.Observation{Time: at(40), RequestID: "r2", ClientID: "c2", Decision: &globalrouter.Decision{BestEffort: true}})
	router.Added("r2", k, at(80))
	router.Added("r2~served", k, at(90))
	router.Removed("r2", k, at(95))
	engine.Left(0, "m2", at(200), "length")
	router.Removed("r2~served", k, at(1700))
	// r3: counted by a router only; c4: admitted by an engine only.
	router.Added("r3", k, at(0))
	router.Removed("r3", k, at(300))
	engine.Admitted(0, "m4", "c4", at(0))
	engine.Left(0, "m4", at(10), "abort")

	samples := []up.AccountingSample{{At: at(150), Routers: 3}, {At: at(3000)}}
	p := rec.report(time.Second, samples, at(5000))
	if p.Requests != 4 || p.Both != 2 || p.RouterOnly != 1 || p.EngineOnly != 1 || p.Open != 0 {
		t.Errorf("requests %d, both %d, router only %d, engine only %d, open %d; want 4, 2, 1, 1, 0", p.Requests, p.Both, p.RouterOnly, p.EngineOnly, p.Open)
	}
	if p.CommitToAdmit.Min != -0.03 || p.CommitToAdmit.Max != 0.1 {
		t.Errorf("commit → admit %v, want -0.03 s (r2) to 0.1 s (r1)", p.CommitToAdmit)
	}
	if p.FinishToFree.Min != 0.1 || p.FinishToFree.Max != 1.5 || p.OverWindow != 1 {
		t.Errorf("finish → free %v, %d over the window; want 0.1 s to 1.5 s, 1", p.FinishToFree, p.OverWindow)
	}
	if p.FinishToLeaseFree.N != 1 || p.FinishToLeaseFree.Max != 0.05 || p.LeaseFreeToFree.Max != 0.05 {
		t.Errorf("finish → lease free %v, lease free → free %v; want 0.05 s each, r1 only", p.FinishToLeaseFree, p.LeaseFreeToFree)
	}
	if p.Doubled != 1 || p.MaxRouters != 2 || p.DoubledSeconds != 0.005 {
		t.Errorf("doubled %d, max %d entries, %.3f s; want 1, 2, 0.005", p.Doubled, p.MaxRouters, p.DoubledSeconds)
	}
	if p.BestEffort != 1 || p.BestEffortLate != 1 {
		t.Errorf("best effort %d, committed after the engine %d; want 1, 1", p.BestEffort, p.BestEffortLate)
	}
	// At 150 ms the routers count r1, r2 and r3: each held by an engine
	// within ±1 s but r3, never admitted.
	if p.RoutersUnmatched != 1 || p.EnginesUnmatched != 0 || p.SamplesUnmatched != 1 || p.SampleSkew != 0 {
		t.Errorf("window check: routers unmatched %d, engines unmatched %d, samples %d, skew %d; want 1, 0, 1, 0", p.RoutersUnmatched, p.EnginesUnmatched, p.SamplesUnmatched, p.SampleSkew)
	}
}
