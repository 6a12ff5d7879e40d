package sim

import "testing"

// TestCPUTierReplay: with a CPU tier behind a small GPU cache, prefixes
// evicted from the GPU are found again on the CPU (the hit ratio rises
// over the same replay without the tier), and the tier-aware cost finds at
// least as many as the one blind to lower tiers.
func TestCPUTierReplay(t *testing.T) {
	tr := randomTrace(t, 300, 7)
	kvgate, blind := KVGateCost(), KVGateCost()
	blind.Name, blind.NoTiers = "kvgate-no-tiers", true
	run := func(cpuTokens int) map[string]*Result {
		rep, err := Run(testContext(t), Config{Trace: tr, Workers: 4, Policies: []Policy{kvgate, blind},
			BlockSize: 16, KVTokens: 4096, CPUKVTokens: cpuTokens, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*Result{}
		for _, r := range rep.Results {
			out[r.Policy] = r
		}
		return out
	}
	without, with := run(0), run(1<<16)
	if with["kvgate-cost"].HitRatio <= without["kvgate-cost"].HitRatio {
		t.Errorf("hit ratio with a CPU tier %.3f, without %.3f: want higher", with["kvgate-cost"].HitRatio, without["kvgate-cost"].HitRatio)
	}
	if with["kvgate-cost"].HitRatio < with["kvgate-no-tiers"].HitRatio {
		t.Errorf("tier-aware hit ratio %.3f below the tier-blind %.3f", with["kvgate-cost"].HitRatio, with["kvgate-no-tiers"].HitRatio)
	}
	if p, err := ParsePolicy("kvgate-no-tiers"); err != nil || !p.NoTiers {
		t.Errorf("ParsePolicy(kvgate-no-tiers) = %+v, %v", p, err)
	}
}
