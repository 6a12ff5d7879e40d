package sim

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// mooncakeLine is one trace line with blocks of 64 tokens.
func mooncakeLine(tsMS, out int, ids ...int) string {
	var s []string
	for _, id := range ids {
		s = append(s, fmt.Sprint(id))
	}
	return fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`, tsMS, 64*len(ids), out, strings.Join(s, ", "))
}

func loadTestTrace(t testing.TB, lines []string) *Trace {
	t.Helper()
	tr, err := LoadTrace(strings.NewReader(strings.Join(lines, "\n")), LoadOptions{BlockSize: 64, Strict: true})
	if err != nil {
		t.Fatalf("LoadTrace: %v", err)
	}
	return tr
}

// randomTrace is a small workload with reuse: a few shared "system
// prompts", multi-turn conversations and one-off prompts.
func randomTrace(t testing.TB, n int, seed uint64) *Trace {
	rng := rand.New(rand.NewPCG(seed, 0))
	type conv struct{ ids []int }
	var convs []*conv
	next := 1000
	var lines []string
	ts := 0
	for range n {
		ts += rng.IntN(40)
		var ids []int
		switch k := rng.IntN(3); {
		case k == 0 && len(convs) > 0: // next turn of a conversation
			c := convs[rng.IntN(len(convs))]
			for range 1 + rng.IntN(3) {
				c.ids = append(c.ids, next)
				next++
			}
			ids = slices.Clone(c.ids)
		case k == 1: // a new conversation on one of 4 system prompts
			sys := rng.IntN(4) * 100
			c := &conv{ids: []int{sys, sys + 1, sys + 2, next}}
			next++
			convs = append(convs, c)
			ids = slices.Clone(c.ids)
		default: // a one-off prompt
			for range 1 + rng.IntN(6) {
				ids = append(ids, next)
				next++
			}
		}
		lines = append(lines, mooncakeLine(ts, 1+rng.IntN(40), ids...))
	}
	return loadTestTrace(t, lines)
}

func allPolicies() []Policy {
	return append(DefaultPolicies(), Policy{Name: "cost-temp", Kind: KindCost, Credit: 1, Scale: 1, Temperature: 0.5})
}

func TestRunIsDeterministicGivenASeed(t *testing.T) {
	tr := randomTrace(t, 150, 1)
	cfg := Config{
		Trace: tr, Seed: 42, Workers: 4, Policies: allPolicies(), KVTokens: 4096, Rate: 3, Parallel: 2,
		Topologies: []Topology{{Kind: TopologyFlat}, {Kind: TopologyPools, Pools: 2}, {Kind: TopologyDisagg, PrefillWorkers: 2}},
		EventDelay: 5 * time.Millisecond,
	}
	runJSON := func(cfg Config) (*Report, string) {
		rep, err := Run(testContext(t), cfg)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		rep.Replay = ReplayStats{}
		var b bytes.Buffer
		if err := rep.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		return rep, b.String()
	}
	rep, first := runJSON(cfg)
	_, second := runJSON(cfg)
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("same seed, different reports (-first +second):\n%s", diff)
	}
	for _, r := range rep.Results {
		if r.Completed != len(tr.Requests) {
			t.Errorf("%s: %d of %d requests completed", r.Label(), r.Completed, len(tr.Requests))
		}
		if r.HitRatio > rep.OracleHitRatio+1e-9 {
			t.Errorf("%s: hit ratio %.4f above the oracle's %.4f", r.Label(), r.HitRatio, rep.OracleHitRatio)
		}
		if r.TTFTMS.P50 <= 0 || r.TTFTMS.P99 < r.TTFTMS.P50 {
			t.Errorf("%s: TTFT %+v is not a distribution", r.Label(), r.TTFTMS)
		}
	}
	cfg.Seed = 43
	if _, other := runJSON(cfg); other == first {
		t.Error("a different seed gave the same report")
	}
}

// oracleByPrefixes is the oracle computed from token prefixes directly,
// without block hashes: a request's leading block k hits if an earlier
// prompt had the same first k blocks of tokens.
func oracleByPrefixes(tr *Trace, blockSize int, seed uint64) float64 {
	seen := map[string]bool{}
	var hit, total int
	for _, r := range tr.Requests {
		toks := r.AppendTokens(nil, tr.BlockSize, seed)
		key := func(k int) string { return fmt.Sprint(toks[:k*blockSize]) }
		k := 0
		for k < (len(toks)-1)/blockSize && seen[key(k+1)] {
			k++
		}
		hit += k * blockSize
		total += len(toks)
		for j := 1; j <= len(toks)/blockSize; j++ {
			seen[key(j)] = true
		}
	}
	return float64(hit) / float64(total)
}

func TestOracleMatchesIndependentComputation(t *testing.T) {
	tr := randomTrace(t, 120, 7)
	for _, bs := range []int{16, 48, 64} {
		rep, err := Run(testContext(t), Config{Trace: tr, Seed: 3, Workers: 2, BlockSize: bs, Policies: []Policy{{Name: "rr", Kind: KindRoundRobin}}})
		if err != nil {
			t.Fatal(err)
		}
		want := oracleByPrefixes(tr, bs, 3)
		if want == 0 {
			t.Fatal("the test trace has no reuse")
		}
		if d := rep.OracleHitRatio - want; d > 1e-12 || d < -1e-12 {
			t.Errorf("block size %d: oracle %.6f, want %.6f", bs, rep.OracleHitRatio, want)
		}
	}
}

// Two conversations on two workers under light load: a KV-aware policy keeps
// each conversation on the worker holding its history; a cost policy also
// puts the second conversation on the idle worker.
func TestConversationsStickToTheirWorker(t *testing.T) {
	var lines []string
	a, b := []int{100}, []int{200}
	for turn := range 6 {
		lines = append(lines, mooncakeLine(500*turn, 8, a...), mooncakeLine(500*turn+5, 8, b...))
		a, b = append(a, 101+turn), append(b, 201+turn)
	}
	tr := loadTestTrace(t, lines)
	policies := []Policy{{Name: KindKVOverlap, Kind: KindKVOverlap}, Dynamo(), KVGate()}
	for _, topo := range []Topology{{Kind: TopologyFlat}, {Kind: TopologyPools, Pools: 2}} {
		rep, err := Run(testContext(t), Config{Trace: tr, Seed: 1, Workers: 2, Policies: policies, Topologies: []Topology{topo}})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			wa, wb := r.workers[0], r.workers[1]
			for i, w := range r.workers {
				if want := []int{wa, wb}[i%2]; w != want {
					t.Errorf("%s: request %d (conversation %c, turn %d) on worker %d, want %d (its first turn's)", r.Label(), i, "ab"[i%2], i/2, w, want)
				}
			}
			if r.Policy != KindKVOverlap && wa == wb {
				t.Errorf("%s: both conversations on worker %d, want the second on the idle one", r.Label(), wa)
			}
		}
	}
}

// A hot shared prefix under a burst of heavy requests (each with 2,048
// uncached tokens after the 512 shared ones): kv-overlap alone piles every
// request onto the worker that cached the prefix first; the cost policies
// see the queued prefill work and spread the load.
func TestHotPrefixSpreadsUnderLoad(t *testing.T) {
	const n, workers = 48, 4
	var lines []string
	for i := range n {
		ids := []int{1, 2, 3, 4, 5, 6, 7, 8}
		for j := range 32 {
			ids = append(ids, 1000+100*i+j)
		}
		lines = append(lines, mooncakeLine(i, 64, ids...))
	}
	tr := loadTestTrace(t, lines)
	policies := []Policy{{Name: KindKVOverlap, Kind: KindKVOverlap}, Dynamo(), KVGate()}
	rep, err := Run(testContext(t), Config{Trace: tr, Seed: 1, Workers: workers, Policies: policies})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		count := make([]int, workers)
		for _, w := range r.workers {
			count[w]++
		}
		busiest := slices.Max(count)
		t.Logf("%s: per-worker requests %v", r.Label(), count)
		if r.Policy == KindKVOverlap {
			if busiest < n-1 {
				t.Errorf("%s: per-worker requests %v, want all but the first on one worker", r.Label(), count)
			}
			continue
		}
		if slices.Min(count) < n/workers/2 || busiest > 2*n/workers {
			t.Errorf("%s: per-worker requests %v, want between %d and %d each", r.Label(), count, n/workers/2, 2*n/workers)
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	tr := randomTrace(t, 5, 1)
	for name, cfg := range map[string]Config{
		"no trace":      {},
		"uneven pools":  {Trace: tr, Workers: 5, Topologies: []Topology{{Kind: TopologyPools, Pools: 2}}},
		"disagg all":    {Trace: tr, Workers: 2, Topologies: []Topology{{Kind: TopologyDisagg, PrefillWorkers: 2}}},
		"negative rate": {Trace: tr, Rate: -1},
		"bad policy":    {Trace: tr, Policies: []Policy{{Name: "x", Kind: "x"}}},
	} {
		if _, err := Run(testContext(t), cfg); err == nil {
			t.Errorf("%s: Run accepted %+v", name, cfg)
		}
	}
}

func TestParsePolicies(t *testing.T) {
	got, err := ParsePolicies("dynamo, cost:credit=2,scale=1.5,temp=0.1,kvgate,round-robin")
	if err != nil {
		t.Fatal(err)
	}
	want := []Policy{Dynamo(), {Name: "cost:credit=2,scale=1.5,temp=0.1", Kind: KindCost, Credit: 2, Scale: 1.5, Temperature: 0.1}, KVGate(), {Name: KindRoundRobin, Kind: KindRoundRobin}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePolicies (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"fastest", "cost:credit", "cost:weight=2", "cost:credit=-1"} {
		if _, err := ParsePolicies(bad); err == nil {
			t.Errorf("ParsePolicies(%q) accepted", bad)
		}
	}
}

func TestReportRenders(t *testing.T) {
	tr := randomTrace(t, 40, 2)
	rep, err := Run(testContext(t), Config{Trace: tr, TraceName: "t<1>", Workers: 2, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var table, svg bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, p := range DefaultPolicies() {
		if !strings.Contains(table.String(), p.Name) {
			t.Errorf("table lacks policy %s:\n%s", p.Name, table.String())
		}
	}
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	s := svg.String()
	if !strings.HasPrefix(s, "<svg") || !strings.HasSuffix(s, "</svg>\n") || strings.Count(s, "<polyline") != len(rep.Results) || !strings.Contains(s, "t&lt;1&gt;") {
		t.Errorf("SVG malformed:\n%s", s)
	}
}

// TestCapacityOracle checks the capacity oracle by hand on a tiny workload,
// and against the infinite oracle: equal with room for everything, lower
// with less.
func TestCapacityOracle(t *testing.T) {
	// Three prompts of 4 blocks (bs 1, so 5 tokens: 4 usable blocks):
	// A, B (no shared block), A again.
	wl := &workload{blockSize: 1, reqs: []Request{{InputLength: 5}, {InputLength: 5}, {InputLength: 5}},
		hashes: [][]uint64{{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {1, 2, 3, 4, 5}}}
	for _, tc := range []struct {
		capacity int
		want     float64
	}{
		{100, 4.0 / 15}, // the third hits 4 blocks, as the infinite oracle
		{10, 4.0 / 15},  // both prompts fit
		{7, 2.0 / 15},   // B pushed out A's tail: A's first 2 blocks left
		{5, 0},          // B pushed out all of A
		{0, 0},
	} {
		if got := capacityOracleHitRatio(wl, tc.capacity); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("capacity %d: got %.4f, want %.4f", tc.capacity, got, tc.want)
		}
	}
	if got, want := capacityOracleHitRatio(wl, 100), oracleHitRatio(wl); got != want {
		t.Errorf("with room for all: got %.4f, want the infinite oracle's %.4f", got, want)
	}
	tr := randomTrace(t, 120, 7)
	rep, err := Run(testContext(t), Config{Trace: tr, Seed: 3, Workers: 2, BlockSize: 16, KVTokens: 4096, Policies: []Policy{{Name: "rr", Kind: KindRoundRobin}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.CapacityOracleHitRatio > rep.OracleHitRatio || rep.CapacityOracleHitRatio <= 0 {
		t.Errorf("capacity oracle %.4f: want within (0, oracle %.4f]", rep.CapacityOracleHitRatio, rep.OracleHitRatio)
	}
	r := rep.Results[0]
	if got, want := r.HitVsCapacityOracle, r.HitRatio/rep.CapacityOracleHitRatio; math.Abs(got-want) > 1e-12 {
		t.Errorf("hit_vs_capacity_oracle %.4f, want %.4f", got, want)
	}
}
