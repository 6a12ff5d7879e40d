package sim

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/kvevents"
)

// globalConfig parses a global router configuration for a replay.
func globalConfig(t *testing.T, yaml string) *globalrouter.Config {
	t.Helper()
	c, err := globalrouter.ParseConfig("test.yaml", []byte(yaml), nil)
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	return c
}

func runReport(t *testing.T, cfg Config) *Report {
	t.Helper()
	rep, err := Run(testContext(t), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

func reportJSON(t *testing.T, rep *Report) string {
	t.Helper()
	rep.Replay = ReplayStats{}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

const onePool = `
pools:
  - name: pool-a
    models: [m]
    block_size: 16
    routers: {etcd: true}
`

// onePoolPipelined is onePool committing the probed worker (probe.commit:
// pipelined): the two-step probe then commit draws the router's random
// tie-breaks as the flat replay's one placing BestWorker does, so the
// placements can be compared exactly. With the default (decide) the probe
// and the decide-and-commit each draw one, and ties fall elsewhere.
const onePoolPipelined = "probe: {commit: pipelined}\n" + onePool

// The hashes Decide computes (globalrouter.BlockKeys) are the ones the flat
// replay hands the local router (kvevents.AppendLocalHashes), so the
// routers see the same prompts either way.
func TestDecideHashesAreTheFlatReplays(t *testing.T) {
	tr := randomTrace(t, 40, 3)
	wl, err := newWorkload(tr, 16, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range wl.reqs {
		got, err := globalrouter.BlockKeys(wl.tokens(i), 16, "", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slicesEqual(got, wl.hashes[i]) {
			t.Fatalf("request %d: Decide's hashes differ from the flat replay's", i)
		}
	}
	_ = kvevents.Seed
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// One pool of 8 workers behind the real Decide (default chain: model
// match, disaggregate, cost) places every request where the flat replay of
// the same local router (Dynamo's cost parameters) does: Decide probes
// (BestWorker without a request id) and commits on the probed worker,
// which changes the router's state as the flat replay's decide-and-commit
// does, and draws the router's random tie-breaks identically.
func TestConfigReplayOnePoolMatchesFlat(t *testing.T) {
	tr := randomTrace(t, 300, 7)
	base := Config{Trace: tr, Seed: 5, Workers: 8, KVTokens: 8192, Rate: 4}
	flat := base
	flat.Policies = []Policy{Dynamo()}
	want := runReport(t, flat).Results[0]
	cfg := base
	// Dynamo's chain asked for, as the flat dynamo policy's (the
	// library default is saturation,ttft).
	cfg.Global = &GlobalReplay{Config: globalConfig(t, onePoolPipelined+"    worker_chain: [{name: saturation}, {name: cost}]\n"), Name: "one.yaml"}
	rep := runReport(t, cfg)
	got := rep.Results[0]
	if got.Topology != "config:one.yaml" || got.Policy != "chain" {
		t.Errorf("labelled %s/%s, want config:one.yaml/chain", got.Topology, got.Policy)
	}
	if diff := cmp.Diff(want.workers, got.workers); diff != "" {
		t.Errorf("placements differ (-flat +config):\n%s", diff)
	}
	if got.HitRatio != want.HitRatio || got.TTFTMS != want.TTFTMS || got.Completed != want.Completed {
		t.Errorf("config replay hit %.4f TTFT %+v completed %d; flat hit %.4f TTFT %+v completed %d",
			got.HitRatio, got.TTFTMS, got.Completed, want.HitRatio, want.TTFTMS, want.Completed)
	}
	if got.Completed != len(tr.Requests) {
		t.Errorf("%d of %d completed", got.Completed, len(tr.Requests))
	}
}

// With probe.commit: reserve the replay places every request where the
// flat replay does too: the probe reserves (one tie-break drawn, as the
// flat replay's placing BestWorker draws) and the commit confirms the
// reservation on the same worker before the next request is decided (the
// in-process client is synchronous), so the router's state and draws are
// the flat replay's; the losing pools' reservations, none here, would be
// released before the next decision too.
func TestConfigReplayReserveMatchesFlat(t *testing.T) {
	tr := randomTrace(t, 300, 7)
	base := Config{Trace: tr, Seed: 5, Workers: 8, KVTokens: 8192, Rate: 4}
	flat := base
	flat.Policies = []Policy{Dynamo()}
	want := runReport(t, flat).Results[0]
	cfg := base
	cfg.Global = &GlobalReplay{Config: globalConfig(t, "probe: {commit: reserve}\n"+onePool+"    worker_chain: [{name: saturation}, {name: cost}]\n"), Name: "one.yaml"}
	got := runReport(t, cfg).Results[0]
	if diff := cmp.Diff(want.workers, got.workers); diff != "" {
		t.Errorf("placements differ (-flat +reserve):\n%s", diff)
	}
	if got.HitRatio != want.HitRatio || got.TTFTMS != want.TTFTMS || got.Completed != want.Completed {
		t.Errorf("reserve replay hit %.4f TTFT %+v completed %d; flat hit %.4f TTFT %+v completed %d",
			got.HitRatio, got.TTFTMS, got.Completed, want.HitRatio, want.TTFTMS, want.Completed)
	}
}

const twoPools = `
chain: [model-match, cost]
pools:
  - name: pool-a
    models: [m]
    routers: {static: ["127.0.0.1:7101"]}
  - name: pool-b
    models: [m]
    routers: {etcd: true}
`

func TestConfigReplayTwoPoolsIsDeterministic(t *testing.T) {
	tr := randomTrace(t, 200, 2)
	cfg := Config{Trace: tr, Seed: 9, Workers: 8, KVTokens: 8192, Rate: 3,
		Global: &GlobalReplay{Config: globalConfig(t, twoPools), Name: "two.yaml"}}
	rep := runReport(t, cfg)
	r := rep.Results[0]
	if r.Completed != len(tr.Requests) {
		t.Fatalf("%d of %d completed (rejected %v)", r.Completed, len(tr.Requests), r.DecideRejected)
	}
	perPool := [2]int{}
	for _, w := range r.workers {
		perPool[w/4]++ // workers 0-3 are pool-a's, 4-7 pool-b's
	}
	if perPool[0] == 0 || perPool[1] == 0 {
		t.Errorf("requests per pool %v: one pool took none", perPool)
	}
	if rep.Workers != 8 || len(r.BusySeconds) != 8 {
		t.Errorf("report has %d workers, %d busy times; want 8", rep.Workers, len(r.BusySeconds))
	}
	first := reportJSON(t, rep)
	if second := reportJSON(t, runReport(t, cfg)); first != second {
		t.Errorf("same seed, different reports:\n%s", cmp.Diff(first, second))
	}
	cfg.Seed = 10
	if other := reportJSON(t, runReport(t, cfg)); other == first {
		t.Error("a different seed gave the same report")
	}
}

// Over two pools with probe.commit: reserve every decision releases the
// losing pool's reservation before the next one (the in-process client is
// a Releaser through the local dialer), so the replay ends with nothing
// held (Run fails otherwise) and is deterministic.
func TestConfigReplayTwoPoolsReserve(t *testing.T) {
	tr := randomTrace(t, 200, 2)
	cfg := Config{Trace: tr, Seed: 9, Workers: 8, KVTokens: 8192, Rate: 3,
		Global: &GlobalReplay{Config: globalConfig(t, "probe: {commit: reserve}\n"+twoPools), Name: "two.yaml"}}
	rep := runReport(t, cfg)
	if r := rep.Results[0]; r.Completed != len(tr.Requests) {
		t.Fatalf("%d of %d completed (rejected %v)", r.Completed, len(tr.Requests), r.DecideRejected)
	}
	if first, second := reportJSON(t, rep), reportJSON(t, runReport(t, cfg)); first != second {
		t.Errorf("same seed, different reports:\n%s", cmp.Diff(first, second))
	}
}

func TestConfigReplayPoolWorkers(t *testing.T) {
	tr := randomTrace(t, 60, 2)
	cfg := Config{Trace: tr, Seed: 1, Workers: 8, KVTokens: 8192,
		Global: &GlobalReplay{Config: globalConfig(t, twoPools), Name: "two.yaml", PoolWorkers: map[string]int{"pool-a": 2}}}
	rep := runReport(t, cfg)
	if rep.Workers != 8 {
		t.Fatalf("%d workers, want 2 + 6", rep.Workers)
	}
	cfg.Global.PoolWorkers = map[string]int{"pool-a": 2, "pool-b": 3}
	if rep = runReport(t, cfg); rep.Workers != 5 {
		t.Fatalf("%d workers, want 2 + 3", rep.Workers)
	}
	cfg.Global.PoolWorkers = map[string]int{"pool-c": 2}
	if _, err := Run(testContext(t), cfg); err == nil || !strings.Contains(err.Error(), `"pool-c"`) {
		t.Fatalf("unknown pool: %v, want an error naming it", err)
	}
	cfg.Global.PoolWorkers = map[string]int{"pool-a": 8}
	if _, err := Run(testContext(t), cfg); err == nil {
		t.Fatal("no worker left for pool-b: no error")
	}
}

// The disaggregated example: long uncached prompts are prefilled in the
// prefill pool (block size 64) and decoded in the decode pool (16); short
// ones go to the decode pool alone.
func TestConfigReplayDisaggregated(t *testing.T) {
	c, err := globalrouter.LoadConfig("../examples/pools-disaggregated.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Unique prompts of 30 blocks (1920 tokens), and one prompt of 4
	// blocks (256 tokens) over and over.
	var lines []string
	next := 100
	for i := range 120 {
		ids := []int{1, 2, 3, 4}
		if i%3 == 0 {
			ids = nil
			for range 30 {
				ids = append(ids, next)
				next++
			}
		}
		lines = append(lines, mooncakeLine(i*50, 8, ids...))
	}
	tr := loadTestTrace(t, lines)
	cfg := Config{Trace: tr, Seed: 3, Workers: 8, KVTokens: 1 << 16,
		Global: &GlobalReplay{Config: c, Name: "pools-disaggregated.yaml"}}
	rep := runReport(t, cfg)
	r := rep.Results[0]
	if r.Completed != len(tr.Requests) {
		t.Fatalf("%d of %d completed (rejected %v)", r.Completed, len(tr.Requests), r.DecideRejected)
	}
	for i, w := range r.workers {
		long := tr.Requests[i].InputLength > 1024
		if remote := w < 4; remote != long { // workers 0-3: the prefill pool
			t.Errorf("request %d (%d tokens, uncached) prefilled on worker %d: want the prefill pool iff over the 1024-token threshold", i, tr.Requests[i].InputLength, w)
		}
	}
	// The short prompt, prefilled on the decode workers, hits their
	// caches: 76 of its 80 arrivals at least (4 workers may each miss
	// once), 240 of its 256 tokens each (the last block is computed).
	if min := float64(76*240) / float64(40*1920+80*256); r.HitRatio < min {
		t.Errorf("hit ratio %.3f, want ≥ %.3f: the decode pool's local prefills hit", r.HitRatio, min)
	}
	for i, s := range r.BusySeconds {
		if s <= 0 {
			t.Errorf("worker %d never computed", i)
		}
	}
}

const twoModels = `
models:
  - name: small
  - name: large
pools:
  - name: small-pool
    models: [small]
    routers: {etcd: true}
  - name: large-pool
    models: [large]
    routers: {etcd: true}
`

// Requests of each model go to the pool serving it; a model no pool
// serves is refused by Decide and counted.
func TestConfigReplayMultiModel(t *testing.T) {
	tr := randomTrace(t, 200, 5)
	cfg := Config{Trace: tr, Seed: 2, Workers: 8, KVTokens: 8192,
		Global: &GlobalReplay{Config: globalConfig(t, twoModels), Name: "models.yaml",
			Models: []Share{{"small", 0.5}, {"large", 0.3}, {"nobody", 0.2}}}}
	rep := runReport(t, cfg)
	r := rep.Results[0]
	run := &run{cfg: cfg, wl: &workload{reqs: tr.Requests}}
	perPool := [2]int{}
	unknown := 0
	for i, w := range r.workers {
		switch m := pickShare(cfg.Global.Models, run.mixKey(i)); {
		case m == "nobody":
			unknown++
			if w != -1 {
				t.Errorf("request %d of an unserved model placed on worker %d", i, w)
			}
		case w < 0:
			t.Errorf("request %d of model %s rejected", i, m)
		case (w < 4) != (m == "small"):
			t.Errorf("request %d of model %s on worker %d, the other model's pool", i, m, w)
		default:
			perPool[w/4]++
		}
	}
	if perPool[0] == 0 || perPool[1] == 0 || unknown == 0 {
		t.Fatalf("small %d, large %d, unserved %d: want each", perPool[0], perPool[1], unknown)
	}
	if r.DecideRejected["unknown_model"] != unknown || r.Rejected != unknown {
		t.Errorf("rejected %d %v, want %d unknown_model", r.Rejected, r.DecideRejected, unknown)
	}
}

const priorityShed = `
chain:
  - model-match
  - name: priority
    args:
      tiers:
        - {min_priority: 10, pools: [fast]}
      shed: {max_priority: 0, max_prefill_tokens: 256}
  - cost
pools:
  - name: fast
    models: [m]
    routers: {etcd: true}
  - name: bulk
    models: [m]
    routers: {etcd: true}
`

// Priority classes: low-priority requests are shed when every pool is
// loaded (counted as saturated), high-priority ones never are.
func TestConfigReplayPriorityClasses(t *testing.T) {
	tr := randomTrace(t, 300, 6)
	cfg := Config{Trace: tr, Seed: 4, Workers: 4, KVTokens: 8192, Rate: 20,
		Global: &GlobalReplay{Config: globalConfig(t, priorityShed), Name: "prio.yaml",
			Priorities: []Share{{"0", 0.5}, {"10", 0.5}}}}
	rep := runReport(t, cfg)
	r := rep.Results[0]
	run := &run{cfg: cfg, wl: &workload{reqs: tr.Requests}}
	shed := 0
	for i, w := range r.workers {
		if w >= 0 {
			continue
		}
		if pickShare(cfg.Global.Priorities, splitmix(run.mixKey(i))) == "10" {
			t.Errorf("request %d of priority 10 was shed", i)
		}
		shed++
	}
	if shed == 0 || r.DecideRejected["saturated"] != shed {
		t.Fatalf("%d shed, decide rejected %v: want some, all saturated", shed, r.DecideRejected)
	}
}

func TestParseShares(t *testing.T) {
	got, err := ParseShares("--models", "a=0.7, b=0.3")
	if err != nil || !cmp.Equal(got, []Share{{"a", 0.7}, {"b", 0.3}}) {
		t.Fatalf("ParseShares = %v, %v", got, err)
	}
	for _, bad := range []string{"", "a", "a=0", "a=-1", "=1", "a=1,a=2", "a=x", "a=Inf", "a=NaN"} {
		if _, err := ParseShares("--models", bad); err == nil {
			t.Errorf("ParseShares(%q): no error", bad)
		}
	}
	pw, err := ParsePoolWorkers("a=2,b=6")
	if err != nil || pw["a"] != 2 || pw["b"] != 6 {
		t.Fatalf("ParsePoolWorkers = %v, %v", pw, err)
	}
	for _, bad := range []string{"a", "a=0", "a=x", "=3", "a=1,a=2"} {
		if _, err := ParsePoolWorkers(bad); err == nil || !strings.Contains(err.Error(), "pool workers") {
			t.Errorf("ParsePoolWorkers(%q): %v", bad, err)
		}
	}
}

// A pool's worker_chain is its local router's: the config replay of one
// pool with a prefix-only chain places requests as the flat replay of the
// same chain does, and not as the default chain does.
func TestConfigReplayWorkerChain(t *testing.T) {
	tr := randomTrace(t, 300, 7)
	base := Config{Trace: tr, Seed: 5, Workers: 4, KVTokens: 8192, Rate: 4}
	pol, err := ParsePolicy("chain:prefix=1")
	if err != nil {
		t.Fatal(err)
	}
	flat := base
	flat.Policies = []Policy{pol, Dynamo()}
	flatRep := runReport(t, flat)
	cfg := base
	cfg.Global = &GlobalReplay{Config: globalConfig(t, onePoolPipelined+"    worker_chain: [{name: prefix, weight: 1}]\n"), Name: "chain.yaml"}
	got := runReport(t, cfg).Results[0]
	if diff := cmp.Diff(flatRep.Results[0].workers, got.workers); diff != "" {
		t.Errorf("placements differ from the flat replay of the same chain (-flat +config):\n%s", diff)
	}
	if cmp.Equal(flatRep.Results[1].workers, got.workers) {
		t.Error("the prefix-only chain placed every request as the default chain does: worker_chain ignored?")
	}
}
