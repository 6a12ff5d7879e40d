package up

import (
	"fmt"

	"github.com/kvgate/kvgate/membership"
)

// TopologyDisaggregated: a prefill pool and a decode pool under the global
// router, whose default chain (globalrouter.DefaultChain) has the
// disaggregate policy: a request whose uncached prompt reaches its
// threshold goes to a decode worker with x-prefiller-host-port naming a
// prefill worker, and the decode mocker makes the two hops a P/D sidecar
// would (mocker/pd.go): the prefill request, then the pull of the pinned
// blocks, which it stores and publishes, so both pools' indexes hold the
// prompt (docs/disaggregated.md).
const TopologyDisaggregated = "disaggregated"

// Pool names of TopologyDisaggregated.
const (
	PrefillPool = "prefill"
	DecodePool  = "decode"
)

// DisaggregatedPools are the pools of TopologyDisaggregated: PrefillPool
// with prefill workers, DecodePool with decode workers.
func DisaggregatedPools(prefill, decode int) []PoolSpec {
	return []PoolSpec{
		{Name: PrefillPool, Workers: prefill, Role: membership.RolePrefill},
		{Name: DecodePool, Workers: decode, Role: membership.RoleDecode},
	}
}

// checkDisaggregated reports pools that cannot serve disaggregated: it
// takes a prefill pool and a decode pool, each with workers.
func checkDisaggregated(pools []PoolSpec) error {
	have := map[membership.Role]bool{}
	for _, p := range pools {
		if p.Workers > 0 {
			have[p.Role] = true
		}
		if p.Region != "" {
			return fmt.Errorf("topology %s: pool %s has a region (regions are -topology %s's)", TopologyDisaggregated, p.Name, TopologyRegions)
		}
	}
	if !have[membership.RolePrefill] || !have[membership.RoleDecode] {
		return fmt.Errorf("topology %s: want a prefill pool and a decode pool with workers (DisaggregatedPools)", TopologyDisaggregated)
	}
	return nil
}
