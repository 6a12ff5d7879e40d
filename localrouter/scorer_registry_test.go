package localrouter

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
)

// preferScorer scores one named worker 0, every other 1.
type preferScorer struct{ worker string }

func (s preferScorer) Score(in *ChainInput, cand []int, out []float64) {
	for i, j := range cand {
		out[i] = 1
		if in.Loads[j].Worker.ID == s.worker {
			out[i] = 0
		}
	}
}

func TestScorerRegistry(t *testing.T) {
	reg := BuiltinScorers()
	newPrefer := func(a *ChainArgs) (Scorer, error) {
		w, err := a.String("worker", "")
		return preferScorer{w}, err
	}
	if err := reg.RegisterScorer("prefer", newPrefer); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"prefer", "cost", "saturation"} {
		if err := reg.RegisterScorer(name, newPrefer); !errors.Is(err, ErrDuplicateEntry) {
			t.Errorf("RegisterScorer(%q) twice: %v, want ErrDuplicateEntry", name, err)
		}
	}
	if err := reg.RegisterFilter("none", nil); err == nil {
		t.Error("RegisterFilter with a nil factory: no error")
	}
	// Another registry, and the built-ins a nil Config.Scorers builds
	// from, never see it.
	if _, scorers := BuiltinScorers().Entries(); slices.Contains(scorers, "prefer") {
		t.Errorf("a fresh BuiltinScorers has %v", scorers)
	}
	if _, scorers := NewScorerRegistry().Entries(); len(scorers) != 0 {
		t.Errorf("NewScorerRegistry has %v", scorers)
	}
	specs, err := ParseWorkerChain("saturation,prefer/worker=c")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.WorkerChain = specs
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `unknown filter or scorer "prefer"`) {
		t.Errorf("the built-ins built it: %v", err)
	}
	cfg.Scorers = reg
	r := newRouter(t, cfg, "a", "b", "c")
	sel, err := r.BestWorker(testenv.Context(t), Request{Tokens: toks(32, 1)}, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel.WorkerID != "c" || len(sel.Scores) != 1 || sel.Scores[0].Name != "prefer" {
		t.Errorf("got %s (scores %v), want c chosen by prefer", sel.WorkerID, sel.Scores)
	}
}
