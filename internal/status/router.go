package status

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/pool"
)

// RouterPools snapshots the global router's pools: their state and
// their local routers' circuits, and the decisions each took from gather
// (kvgate_globalrouter_decisions_total; nil: not shown). In-flight counts
// and workers are the local routers' to know: InFlight is -1, Workers
// empty.
func RouterPools(r *globalrouter.Router, gather prometheus.Gatherer) []Pool {
	decisions := DecisionCounts(gather)
	var out []Pool
	for _, h := range r.Health() {
		p := Pool{Name: h.Pool, Role: string(h.Role), State: PoolState(h), InFlight: -1, Decisions: decisions[h.Pool]}
		for _, rs := range h.Routers {
			p.Routers = append(p.Routers, Router{Address: rs.Address, Circuit: circuit(rs.State), Failures: rs.Failures})
		}
		out = append(out, p)
	}
	return out
}

// PoolState is a pool's state as the global router sees it: ok only when
// one of its local routers has answered; "not probed yet" before any
// request reached it, "unreachable" when its routers failed and none
// ever answered.
func PoolState(h globalrouter.PoolHealth) string {
	switch {
	case h.Health.Routers == 0:
		return "no local router"
	case h.Health.Available == 0:
		return "circuit open"
	case h.Health.Recovering:
		return "recovering"
	}
	answered, failures := false, 0
	for _, r := range h.Routers {
		answered = answered || r.Answered
		failures += r.Failures
	}
	switch {
	case answered:
		return "ok"
	case failures > 0:
		return "unreachable"
	}
	return "not probed yet"
}

func circuit(s pool.CircuitState) string {
	return fmt.Sprint(s)
}

// RouterConfig is the global router's configuration and its last reload.
func RouterConfig(r *globalrouter.Router) ConfigInfo {
	cfg := r.Config()
	ci := ConfigInfo{File: cfg.File, ShadowChain: cfg.ShadowChain(), Pools: len(cfg.Pools),
		Probe: fmt.Sprintf("timeout %v, backoff %v..%v", cfg.Probe.Timeout, cfg.Probe.BackoffBase, cfg.Probe.BackoffMax)}
	for _, s := range cfg.Chain {
		ci.Chain = append(ci.Chain, s.Name)
	}
	lr := r.LastReload()
	ci.LastReload = lr.Time
	if lr.Err != nil {
		ci.ReloadError = lr.Err.Error()
	}
	return ci
}

// DecisionCounts reads kvgate_globalrouter_decisions_total{outcome="ok"}
// by pool from gather (empty when gather is nil or lacks it).
func DecisionCounts(gather prometheus.Gatherer) map[string]float64 {
	out := map[string]float64{}
	if gather == nil {
		return out
	}
	mfs, err := gather.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_globalrouter_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var poolName, outcome string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "pool":
					poolName = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			if outcome == "ok" {
				out[poolName] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
