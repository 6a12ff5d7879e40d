// Package flowcontrol is the global router's admission queue: a request
// whose candidate pools are all saturated waits, instead of being refused
// with 429, until a pool has room or its deadline passes.
//
// The queue has strict priority bands (x-kvgate-priority, as the global
// router reads it from trusted callers, or the priority of the
// InferenceObjective a request names, Objective), and within a band shares turns
// fairly between flows (tenants, by the tenancy header; untenanted
// requests are one flow) with a pluggable Fairness (RoundRobin by
// default, Weighted by configured shares); within a flow, first come
// first served. It is bounded per band and in total, in requests and in
// body bytes; each request has a deadline (the configured one, or its
// TTFT target when shorter). A request refused at the door (queue_full),
// at its deadline (queue_deadline), when it can no longer meet its TTFT
// target (queue_late: its wait plus its predicted time to first token on
// the worker it would get passes it; checked at the door and at
// dispatch, Late) or when the router stops
// (queue_closed) is a *Refused, which the global router answers 429 with
// retry-after. Saturation is judged per band (SaturationFor): the bands
// below the top one at lower_band_share of its mark, the headroom that
// keeps the top band's requests from waiting behind theirs in the
// engines' first-come-first-served queues.
//
// The core (Queue) runs nothing by itself: no goroutine, no timer; its
// callers pass the time, and call Enqueue, Peek, Dispatch, Cancel and
// Expire. The global router runs it on the wall clock through Live (one
// goroutine per queue: dispatch on Kick — a request of this router freed
// or finished its prefill — and on a re-probe tick, expiry on a timer);
// the replay (package sim) runs the same Queue in virtual time.
//
// Files: config.go (Config, Band, Capacity, Saturation, the defaults and
// their principles, Validate), queue.go (Queue, Ticket, Refused, Late),
// fairness.go (Fairness, RoundRobin, Weighted), objectives.go
// (Objective, ParseObjectives: the Inference Extension's InferenceObjective
// manifests, strictly, by pool), live.go (Live, Try: the
// wall-clock wrapper), metrics.go (the Prometheus metrics; tenants past
// max_flow_labels are counted as "other").
// docs/flow-control.md describes it for operators.
package flowcontrol
