package sim

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/globalrouter"
)

// tree=2x2 runs the real routers three floors deep: every request
// completes on a leaf worker, all four leaf pools serve, and the same seed
// gives the same report (a different seed, another).
func TestTreeTwoByTwoIsDeterministic(t *testing.T) {
	tr := randomTrace(t, 300, 4)
	top, err := ParseTopology("tree=2x2")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Trace: tr, Seed: 3, Workers: 8, KVTokens: 8192, Rate: 4,
		Topologies: []Topology{top}, Policies: []Policy{KVGate()}}
	rep := runReport(t, cfg)
	r := rep.Results[0]
	if r.Topology != "tree=2x2" {
		t.Errorf("labelled %q, want tree=2x2", r.Topology)
	}
	if r.Completed != len(tr.Requests) {
		t.Fatalf("%d of %d completed (rejected %v)", r.Completed, len(tr.Requests), r.DecideRejected)
	}
	if len(r.workers) != len(tr.Requests) {
		t.Fatalf("%d placements for %d requests", len(r.workers), len(tr.Requests))
	}
	var perLeaf [4]int
	for i, w := range r.workers {
		if w < 0 || w >= 8 {
			t.Fatalf("request %d placed on worker %d, not one of the 8 leaf workers", i, w)
		}
		perLeaf[w/2]++ // workers 2k, 2k+1 are leaf pool k's (region-k/2-p(k%2))
	}
	for k, n := range perLeaf {
		if n == 0 {
			t.Errorf("requests per leaf pool %v: pool %d took none", perLeaf, k)
		}
	}
	if rep.Workers != 8 || len(r.BusySeconds) != 8 {
		t.Errorf("report has %d workers, %d busy times; want 8", rep.Workers, len(r.BusySeconds))
	}
	first := reportJSON(t, rep)
	if second := reportJSON(t, runReport(t, cfg)); first != second {
		t.Errorf("same seed, different reports:\n%s", cmp.Diff(first, second))
	}
	cfg.Seed = 4
	if other := reportJSON(t, runReport(t, cfg)); other == first {
		t.Error("a different seed gave the same report")
	}
}

// tree=1x1 with the probed worker committed (probe.commit: pipelined on
// both global routers) places every request where flat does: the top
// router probes the region, which probes its one pool's router (one
// tie-break draw, as flat's decide-and-commit), then the commit goes down
// with the worker id and draws nothing. With the default decide-and-commit
// each floor decides again at commit time, drawing the router's
// tie-breaks a second time, so placements may differ (as for the config
// replay of one pool, global_test.go).
func TestTreeOneByOneMatchesFlat(t *testing.T) {
	tr := randomTrace(t, 300, 7)
	for _, pol := range []Policy{Dynamo(), KVGate()} {
		t.Run(pol.Name, func(t *testing.T) {
			base := Config{Trace: tr, Seed: 5, Workers: 8, KVTokens: 8192, Rate: 4, Policies: []Policy{pol}}
			want := runReport(t, base).Results[0]
			tree := base
			tree.Topologies = []Topology{{Kind: TopologyTree, Regions: 1, RegionPools: 1}}
			tree.TreeCommit = globalrouter.CommitPipelined
			got := runReport(t, tree).Results[0]
			if diff := cmp.Diff(want.workers, got.workers); diff != "" {
				t.Errorf("placements differ (-flat +tree):\n%s", diff)
			}
			if got.HitRatio != want.HitRatio || got.TTFTMS != want.TTFTMS || got.Completed != want.Completed {
				t.Errorf("tree=1x1 hit %.4f TTFT %+v completed %d; flat hit %.4f TTFT %+v completed %d",
					got.HitRatio, got.TTFTMS, got.Completed, want.HitRatio, want.TTFTMS, want.Completed)
			}
			if got.Completed != len(tr.Requests) {
				t.Errorf("%d of %d completed", got.Completed, len(tr.Requests))
			}
			// The default commit still completes everything.
			tree.TreeCommit = ""
			if d := runReport(t, tree).Results[0]; d.Completed != len(tr.Requests) {
				t.Errorf("decide-and-commit: %d of %d completed", d.Completed, len(tr.Requests))
			}
		})
	}
}

func TestParseTreeTopology(t *testing.T) {
	got, err := ParseTopology("tree=3x2")
	if err != nil || got != (Topology{Kind: TopologyTree, Regions: 3, RegionPools: 2}) || got.Name() != "tree=3x2" {
		t.Errorf("tree=3x2: %+v %q %v", got, got.Name(), err)
	}
	for _, bad := range []string{"tree", "tree=2", "tree=0x2", "tree=2x0", "tree=ax2", "tree=2x", "tree=2x2x2", "tree=-1x2"} {
		if _, err := ParseTopology(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("%q: err %v, want ErrConfig", bad, err)
		}
	}
	for _, c := range []struct {
		workers int
		pol     Policy
	}{{6, Dynamo()}, {8, Policy{Name: KindRoundRobin, Kind: KindRoundRobin}}, {8, Policy{Name: KindRandom, Kind: KindRandom}}} {
		cfg := Config{Trace: randomTrace(t, 5, 1), Workers: c.workers, Policies: []Policy{c.pol},
			Topologies: []Topology{{Kind: TopologyTree, Regions: 2, RegionPools: 2}}}
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%d workers, policy %s: err %v, want ErrConfig", c.workers, c.pol.Name, err)
		}
	}
}

// FuzzParseTopology: any string is parsed or refused with ErrConfig; a
// parsed tree has positive counts and names itself as parsed.
func FuzzParseTopology(f *testing.F) {
	for _, s := range []string{"flat", "pools=2", "disagg=3", "tree=2x2", "tree=1x1", "tree=x", "tree=99999x99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		top, err := ParseTopology(s)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("%q: error %v is not ErrConfig", s, err)
			}
			return
		}
		if top.Kind == TopologyTree {
			if top.Regions < 1 || top.RegionPools < 1 {
				t.Fatalf("%q: %+v", s, top)
			}
			again, err := ParseTopology(top.Name())
			if err != nil || again != top {
				t.Fatalf("%q: %+v names itself %q, which parses to %+v %v", s, top, top.Name(), again, err)
			}
		}
	})
}
