// Package policies decides, for one request, which pool (and which of the
// pool's probed workers) serves it, and in what order the others are
// fallbacks.
//
// A Policy sees the request view (Request) and an immutable snapshot of the
// candidates: per pool its probe result, health, role, weight and load
// (Candidate; the probe result is a routing.Selection, from the leaf package
// api/routing, the only kvgate package policies imports). It returns them
// ranked, so fallbacks come free. Policies run
// in a Chain: filters narrow the list, scorers reorder it with a stable sort,
// and the last policy has the final word; an earlier scorer only breaks the
// ties of a later one. The first candidate of the chain's answer is the
// pick.
//
// Policies are built by name from an explicit Registry (RegisterBuiltins adds
// the built-ins; a duplicate name is an error; nothing registers itself in
// init). Each policy gets its arguments from two places of the
// configuration: its entry in the chain (global arguments), and each pool's
// policy section (per-pool arguments, keyed by policy name). Both are decoded
// strictly: an unknown field is an error naming the file, the line and the
// policy.
//
// The package is a leaf: it imports no router package. The global router
// (package globalrouter) builds the candidates from its probes and turns the
// ranking into a routing decision.
//
// Files: policy.go (Policy, Request, Candidate, Role, SLO, Health),
// chain.go (Chain, Step, Trace), registry.go (Registry, Args, Factory,
// DecodeChain, RegisterBuiltins), section.go (Spec, Section, PoolSection,
// PosError), builtins.go (model-match, header-match, kv-overlap, cost,
// failover), weighted.go (weighted, session-affinity), disaggregate.go
// (disaggregate: remote prefill when it pays), slogrid.go (slo-grid),
// priority.go (priority: tiers and shedding), reads.go (Reads, Reader:
// which request fields and headers a policy reads).
package policies
