package up

import (
	"context"
	"sort"
	"time"

	"github.com/kvgate/kvgate/internal/status"
)

// liveSnapshot is the live status page's source (internal/status, served
// at /kvgate/status/): the global router's view of the pools, completed
// with what kvgate up knows in-process of each local router and worker.
func (s *System) liveSnapshot(context.Context) status.Snapshot {
	snap := status.Snapshot{
		Title: "kvgate up — live status",
		Info: []status.Fact{
			{Label: "up", Value: time.Since(s.started).Round(time.Second).String()},
			{Label: "model", Value: s.cfg.Model},
			{Label: "gateway", Value: s.GatewayURL()},
			{Label: "ext_proc", Value: s.extprocAddr},
			{Label: "NATS", Value: s.NATSURL()},
			{Label: "admin", Value: s.AdminURL()},
		},
		Pools:  status.RouterPools(s.Global, s.Registry),
		Config: status.RouterConfig(s.Global),
		Flow:   status.RouterFlow(s.Global),
	}
	byName := map[string]*status.Pool{}
	for i := range snap.Pools {
		byName[snap.Pools[i].Name] = &snap.Pools[i]
	}
	for _, p := range s.Pools {
		sp := byName[p.Name]
		if sp == nil {
			continue
		}
		stopped := p.stopped.Load()
		if !stopped {
			sp.InFlight = p.Requests()
			sp.IndexBlocks = p.Router.Router().Index().Stats().Nodes
		}
		loads := p.Loads()
		for _, w := range p.Workers {
			es := w.Stats()
			sw := status.Worker{ID: w.ID, Address: w.Addr, KVUsage: es.KVUsage, CachedBlocks: es.CachedBlocks,
				PrefixQueryTokens: es.PrefixQueryTokens, PrefixHitTokens: es.PrefixHitTokens}
			for k, l := range loads {
				if k.ID == w.ID {
					sw.InFlight += l.ActiveRequests
					sw.PrefillTokens += l.PrefillTokens
				}
			}
			sp.Workers = append(sp.Workers, sw)
		}
		sort.Slice(sp.Workers, func(i, j int) bool { return sp.Workers[i].ID < sp.Workers[j].ID })
	}
	return snap
}
