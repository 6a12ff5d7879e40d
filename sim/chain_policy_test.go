package sim

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/localrouter"
)

func TestParseChainPolicies(t *testing.T) {
	got, err := ParsePolicies("dynamo,chain:saturation,cost=1/credit=8/scale=8,cold=2,kvgate,chain:prefix=2,decode=1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	want := "dynamo|chain:saturation,cost=1/credit=8/scale=8,cold=2|kvgate|chain:prefix=2,decode=1"
	if strings.Join(names, "|") != want {
		t.Fatalf("policies %q, want %q", strings.Join(names, "|"), want)
	}
	c := got[1].routerConfig(16, 0)
	if localrouter.FormatWorkerChain(c.WorkerChain) != "saturation,cost=1/credit=8/scale=8,cold=2" || got[1].Kind != KindCost {
		t.Errorf("chain policy config: %+v", c.WorkerChain)
	}
	r, err := localrouter.New(c, localrouter.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Config().OverlapScoreCredit != 8 || r.Config().PrefillLoadScale != 8 {
		t.Errorf("credit/scale from the cost scorer's args: %+v", r.Config())
	}
	if len(got[0].Chain) != 0 || len(got[2].Chain) != 0 {
		t.Errorf("dynamo and kvgate name no chain")
	}
	for _, bad := range []string{"chain:", "chain:nope=1", "chain:cost/x=1"} {
		if _, err := ParsePolicy(bad); err == nil {
			t.Errorf("ParsePolicy(%q) accepted", bad)
		}
	}
}
