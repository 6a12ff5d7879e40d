package sim

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

func TestTTFTScoreFollowsTheTimingModel(t *testing.T) {
	m := ttftModel{chunk: 8192, kvBlocks: 65536, speedup: 1, ext: 1}
	const bs = 16
	tok := mocker.PrefillMillis(8192) / 8192
	near := func(t *testing.T, what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s: score %.6f ms, want %.6f", what, got, want)
		}
	}
	// An idle worker, nothing cached: one chunk of prefill, no decode step,
	// and the same GPU time again for the request behind it.
	near(t, "idle, cold", m.score(localrouter.PotentialLoad{PotentialPrefillTokens: 8192}, 8192, bs),
		mocker.PrefillMillis(8192)+8192*tok)
	// All but the last block cached: only the uncached tokens count.
	near(t, "idle, warm", m.score(localrouter.PotentialLoad{PotentialPrefillTokens: 16, OverlapBlocks: 511}, 8192, bs),
		mocker.PrefillMillis(16)+16*tok)
	// 10,000 tokens queued ahead of a cold 8,192-token prompt on a busy
	// worker at half KV occupancy: three chunks, three decode steps.
	busy := localrouter.PotentialLoad{PotentialPrefillTokens: 18192, PotentialDecodeBlocks: 32768, ActiveRequests: 3}
	near(t, "busy", m.score(busy, 8192, bs),
		2*mocker.PrefillMillis(8192)+mocker.PrefillMillis(18192-2*8192)+3*mocker.DecodeMillis(0.5)+8192*tok)
	// ext 0: the request's own TTFT alone.
	m0 := m
	m0.ext = 0
	near(t, "ext 0", m0.score(busy, 8192, bs), m.score(busy, 8192, bs)-8192*tok)
	// Speedup divides every term.
	m2 := m
	m2.speedup = 2
	near(t, "speedup 2", m2.score(busy, 8192, bs), m.score(busy, 8192, bs)/2)
}

func TestTTFTScoreOrdersWorkers(t *testing.T) {
	m := ttftModel{chunk: 8192, kvBlocks: 65536, speedup: 1, ext: 1}
	const bs, isl = 16, 4096
	idle := localrouter.PotentialLoad{PotentialPrefillTokens: isl}
	cached := localrouter.PotentialLoad{PotentialPrefillTokens: 16, OverlapBlocks: isl/bs - 1}
	for _, c := range []struct {
		name          string
		better, worse localrouter.PotentialLoad
	}{
		{"a cached prefix beats none", cached, idle},
		{"a shorter queue wins", idle, localrouter.PotentialLoad{PotentialPrefillTokens: isl + 1000, ActiveRequests: 1}},
		{"lower KV occupancy wins", localrouter.PotentialLoad{PotentialPrefillTokens: isl, PotentialDecodeBlocks: 1000, ActiveRequests: 1},
			localrouter.PotentialLoad{PotentialPrefillTokens: isl, PotentialDecodeBlocks: 60000, ActiveRequests: 1}},
		// A cached worker's queue is not hidden by its cache, as it is
		// under Dynamo's max(0, prefill - credit × overlap) with credit 2.
		{"a cached worker's queue counts", localrouter.PotentialLoad{PotentialPrefillTokens: 16 + 100, OverlapBlocks: isl/bs - 1, ActiveRequests: 1},
			localrouter.PotentialLoad{PotentialPrefillTokens: 16 + 2000, OverlapBlocks: isl/bs - 1, ActiveRequests: 1}},
	} {
		if b, w := m.score(c.better, isl, bs), m.score(c.worse, isl, bs); !(b < w) {
			t.Errorf("%s: scores %.3f and %.3f ms, want the first lower", c.name, b, w)
		}
	}
	// Where the externality decides: a worker holding the prefix behind a
	// queue, against an idle cold one. Own TTFT alone (ext 0) prefers the
	// idle worker; counting the cold prefill's GPU time once more (ext 1)
	// keeps the request on its cache.
	queued := localrouter.PotentialLoad{PotentialPrefillTokens: 16 + 5000, OverlapBlocks: isl/bs - 1, ActiveRequests: 1}
	m0 := m
	m0.ext = 0
	if m0.score(queued, isl, bs) <= m0.score(idle, isl, bs) {
		t.Errorf("ext 0: the queued cached worker scores %.1f ms, the idle one %.1f: want the idle one lower", m0.score(queued, isl, bs), m0.score(idle, isl, bs))
	}
	if m.score(queued, isl, bs) >= m.score(idle, isl, bs) {
		t.Errorf("ext 1: the queued cached worker scores %.1f ms, the idle one %.1f: want the cached one lower", m.score(queued, isl, bs), m.score(idle, isl, bs))
	}
}

func TestParseTTFTPolicies(t *testing.T) {
	got, err := ParsePolicies("ttft, ttft:ext=0.5,dynamo,kvgate,kvgate-cost,kvgate-r1,ttft:ext=auto")
	if err != nil {
		t.Fatal(err)
	}
	want := []Policy{TTFT(1), {Name: "ttft:ext=0.5", Kind: KindTTFT, Externality: 0.5}, Dynamo(), KVGate(), KVGateCost(), KVGateRound1(), {Name: "ttft:ext=auto", Kind: KindTTFT, ExtAuto: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePolicies (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"ttft:ext=-1", "ttft:ext", "ttft:credit=2", "ttft:ext=NaN", "ttft:ext=Inf"} {
		if _, err := ParsePolicies(bad); err == nil {
			t.Errorf("ParsePolicies(%q) accepted", bad)
		}
	}
}

// FuzzParsePolicies: any list is parsed into valid policies or refused with
// ErrConfig, never a panic.
func FuzzParsePolicies(f *testing.F) {
	for _, s := range []string{"kvgate", "ttft:ext=2,dynamo", "cost:credit=2,scale=766,temp=0.1,tiers=0", "ttft:ext=", ",,", "cost:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParsePolicies(s)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("ParsePolicies(%q): %v, not ErrConfig", s, err)
			}
			return
		}
		for _, p := range ps {
			if err := p.validate(); err != nil {
				t.Fatalf("ParsePolicies(%q) returned invalid %+v: %v", s, p, err)
			}
		}
	})
}

// With ext=auto the externality is the requests expected to arrive at the
// worker before this one's first token: rate per worker × predicted TTFT.
func TestTTFTScoreMeasuredExternality(t *testing.T) {
	const bs, isl = 16, 4096
	l := localrouter.PotentialLoad{PotentialPrefillTokens: isl + 6000, ActiveRequests: 2, PotentialDecodeBlocks: 1000}
	own := ttftModel{chunk: 8192, kvBlocks: 65536, speedup: 1}
	ttft := own.score(l, isl, bs)
	m := own
	m.perWorkerRate = 0.004 // 4 requests/s per worker, in requests/ms
	want := ttft + 0.004*ttft*isl*own.tokenMillis()
	if got := m.score(l, isl, bs); math.Abs(got-want) > 1e-9*want {
		t.Errorf("score %.6f ms, want %.6f (TTFT %.3f ms, %.3f requests delayed)", got, want, ttft, 0.004*ttft)
	}
}

func TestArrivalRate(t *testing.T) {
	var a arrivalRate
	now := epoch
	var got float64
	for range 2000 { // 20/s for 100 s: ten time constants
		now = now.Add(50 * time.Millisecond)
		got = a.observe(now)
	}
	if got < 19 || got > 21 {
		t.Errorf("rate after 100 s of 20 arrivals/s: %.2f/s, want about 20", got)
	}
	if got = a.observe(now.Add(30 * time.Second)); got > 2 {
		t.Errorf("rate after 30 s of silence: %.2f/s, want below 2", got)
	}
}
