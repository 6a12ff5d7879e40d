package status

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
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
	ci.FlowControl = flowSummary(cfg.FlowControl)
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

// FlowBand is one band of one flow-control queue.
type FlowBand struct {
	// Pools are the pools the queue's models are served by.
	Pools    string `json:"pools"`
	Band     string `json:"band"`
	Requests int    `json:"requests"`
	Bytes    int64  `json:"bytes"`
	// Flows are the tenants waiting, most first ("none": untenanted),
	// at most maxFlowsShown of them, then how many more.
	Flows string `json:"flows"`
}

// maxFlowsShown bounds the tenants a band's row names.
const maxFlowsShown = 8

// RouterFlow snapshots the global router's flow-control queues: every
// band of every queue a request has waited in.
func RouterFlow(r *globalrouter.Router) []FlowBand {
	var out []FlowBand
	for _, q := range r.FlowQueues() {
		for _, b := range q.Bands {
			names := slices.SortedFunc(maps.Keys(b.Flows), func(x, y string) int {
				return cmp.Or(cmp.Compare(b.Flows[y], b.Flows[x]), cmp.Compare(x, y))
			})
			var parts []string
			for i, n := range names {
				if i == maxFlowsShown {
					parts = append(parts, fmt.Sprintf("… %d more", len(names)-i))
					break
				}
				if n == "" {
					n = flowcontrol.NoFlow
				}
				parts = append(parts, fmt.Sprintf("%s: %d", n, b.Flows[names[i]]))
			}
			out = append(out, FlowBand{Pools: q.Pools, Band: b.Name, Requests: b.Requests, Bytes: b.Bytes, Flows: strings.Join(parts, ", ")})
		}
	}
	return out
}

// flowSummary is flow_control in one line.
func flowSummary(c flowcontrol.Config) string {
	if !c.Enabled {
		return "off"
	}
	var bands []string
	for i, b := range c.Bands {
		sat := c.BandSaturation(i)
		mark := fmt.Sprintf("saturated above %d prefill tokens, %d decode tokens", max(sat.MaxPrefillTokens, 0), sat.MaxDecodeTokens)
		if b.MinPriority != nil {
			bands = append(bands, fmt.Sprintf("%s (priority ≥ %d; %s)", b.Name, *b.MinPriority, mark))
		} else {
			bands = append(bands, fmt.Sprintf("%s (%s)", b.Name, mark))
		}
	}
	return fmt.Sprintf("bands %s; 0 tokens: not checked; capacity %d requests, %d bytes per queue; deadline %v; fairness %s; %d objectives named inline",
		strings.Join(bands, " > "), c.Capacity.Requests, c.Capacity.Bytes, c.Deadline, c.Fairness, len(c.Objectives))
}
