package up_test

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/up"
)

func TestAnalyzeAccounting(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tt := range []struct {
		name             string
		samples          []up.AccountingSample
		diverged, maxDiv int
		longest          float64
		outside          int
	}{
		{"equal", []up.AccountingSample{{At: at(0), Routers: 0, Engines: 0, Decided: 0}, {At: at(100), Routers: 3, Engines: 3, Decided: 3}, {At: at(200), Routers: 0, Engines: 0, Decided: 0}}, 0, 0, 0, 0},
		// The router counts a request 100 ms before the engine and frees
		// it 100 ms after: within a 1 s window.
		{"lagging", []up.AccountingSample{{At: at(0), Routers: 1, Engines: 0, Decided: 1}, {At: at(100), Routers: 1, Engines: 1, Decided: 1}, {At: at(200), Routers: 1, Engines: 0, Decided: 1}, {At: at(300), Routers: 0, Engines: 0, Decided: 0}}, 2, 1, 0.1, 0},
		// A request the routers never count.
		{"unaccounted", []up.AccountingSample{{At: at(0), Routers: 0, Engines: 0, Decided: 0}, {At: at(100), Routers: 0, Engines: 1, Decided: 0}, {At: at(1200), Routers: 0, Engines: 1, Decided: 0}, {At: at(2300), Routers: 0, Engines: 1, Decided: 0}, {At: at(3400), Routers: 0, Engines: 0, Decided: 0}}, 3, 1, 3.3, 2},
		// Phantom load on the routers after the engines finished.
		{"phantom", []up.AccountingSample{{At: at(0), Routers: 1, Engines: 1, Decided: 1}, {At: at(100), Routers: 1, Engines: 0, Decided: 1}, {At: at(1200), Routers: 1, Engines: 0, Decided: 1}, {At: at(2300), Routers: 1, Engines: 0, Decided: 1}}, 3, 1, 2.2, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := up.AnalyzeAccounting(tt.samples, time.Second)
			if rep.Samples != len(tt.samples) || rep.Diverged != tt.diverged || rep.MaxDivergence != tt.maxDiv || rep.OutsideWindow != tt.outside ||
				rep.LongestDivergenceSeconds < tt.longest-1e-9 || rep.LongestDivergenceSeconds > tt.longest+1e-9 {
				t.Errorf("got %+v, want diverged %d, max %d, longest %v s, outside %d", rep, tt.diverged, tt.maxDiv, tt.longest, tt.outside)
			}
		})
	}
}

// TestAccountingShift: the shift is how far in time the engines' count
// had to be looked for to equal the routers'.
func TestAccountingShift(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rep := up.AnalyzeAccounting([]up.AccountingSample{{At: at(0), Routers: 0, Engines: 0, Decided: 0}, {At: at(100), Routers: 0, Engines: 1, Decided: 0}, {At: at(1200), Routers: 0, Engines: 1, Decided: 0}, {At: at(2300), Routers: 0, Engines: 1, Decided: 0}, {At: at(3400), Routers: 0, Engines: 0, Decided: 0}, {At: at(3500), Routers: 7, Engines: 0, Decided: 7}}, time.Second)
	if rep.ShiftMaxSeconds < 1.2-1e-9 || rep.ShiftMaxSeconds > 1.2+1e-9 || rep.Unmatched != 1 {
		t.Errorf("got shift max %v s and %d unmatched, want 1.2 s and 1 (the 7 no engine count equals)", rep.ShiftMaxSeconds, rep.Unmatched)
	}
}

// TestAccountingDecided: the routers' count against the global router's
// decisions in flight: a decision no router counts is unaccounted.
func TestAccountingDecided(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rep := up.AnalyzeAccounting([]up.AccountingSample{{At: at(0), Routers: 0, Engines: 0, Decided: 0}, {At: at(100), Routers: 1, Engines: 1, Decided: 2}, {At: at(200), Routers: 2, Engines: 2, Decided: 2}, {At: at(300), Routers: 2, Engines: 2, Decided: 1}, {At: at(400), Routers: 0, Engines: 0, Decided: 0}}, time.Second)
	if rep.Unaccounted != 1 || rep.DecidedDiverged != 2 || rep.DecidedMaxDivergence != 1 || rep.DecidedLongestDivergenceSeconds < 0.1-1e-9 || rep.DecidedLongestDivergenceSeconds > 0.1+1e-9 {
		t.Errorf("got %+v, want 1 unaccounted, 2 differing samples by at most 1, the longest 0.1 s", rep)
	}
}
