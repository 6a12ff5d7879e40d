// Package routing holds the vocabulary every floor of the request path
// shares: the worker a local router chose for a request (Selection; its
// WorkerKey, Selected), the per-request change of its cost parameters
// (Override), a worker-chain entry (ScorerSpec, chain.go) and the errors a
// local router answers with (ErrUnknownRequest, ErrNoAllowedWorker, ...:
// worker.go). It is a leaf: it imports nothing of kvgate, so the local
// router, its Go client, the pool layer, the policies and the global router
// all speak these types without the client side linking the local
// router's core; the protobuf messages (api/localrouter/v1 Selection and
// ConfigOverride, the Reason… of an error) are the wire form, converted
// only by the local router's gRPC server and its Go client.
//
// Files: routing.go (Selection and its Score terms, Override and its
// Validate, AddressAllowed: the endpoint subset), chain.go (ScorerSpec),
// worker.go (WorkerKey, Selected, the error sentinels, MaxReserveTTL),
// signals.go (EngineSample, SignalsReport, Skip: the engine-signal side of
// a choice).
package routing

import (
	"fmt"
	"math"
	"net"
	"strings"
)

// Selection is the worker a local router chose for a request, and the terms
// of its cost. A value; it holds no references.
type Selection struct {
	WorkerID string
	DPRank   uint32
	// Address is the worker's host:port (empty when the router knows no
	// address for it, e.g. the worker is leaving the pool).
	Address string
	// OverlapBlocks are the request's leading blocks the worker holds.
	OverlapBlocks int
	// RequestBlocks are the request's complete blocks at BlockSize.
	RequestBlocks int
	// BlockSize is the pool's KV block size in tokens.
	BlockSize int
	// ISL is the prompt length in tokens (0 when the answer did not say;
	// the caller that knows it sets it).
	ISL int
	// PrefillTokens and DecodeBlocks are the worker's potential load with
	// the request (the cost terms).
	PrefillTokens int
	DecodeBlocks  int
	// Cost is the predicted waiting, in milliseconds, that placing the
	// request on the worker adds: its time to first token there plus the
	// delay its uncached prefill imposes on the requests behind it, from
	// the engine timing model (the worker chain's ttft scorer; the default
	// calibration when the chain has none). One unit whatever the pool's
	// chain, so that pools compare (the global router's cost policy).
	Cost float64
	// TTFT is the predicted time to first token of the request alone on
	// the worker, in milliseconds: Cost less the delay it imposes on
	// those behind it (same timing model). Flow control reads it (a
	// queued request whose remaining budget is below it is refused).
	TTFT float64
	// ChainScore is the worker's total under the pool's worker chain, in
	// the chain's own units (blocks of prefill time under ttft, Dynamo's
	// cost in blocks under cost); it compares workers of one pool only.
	ChainScore float64
	// Candidates is how many (worker, dp_rank) the router considered.
	Candidates int
	// Router is the address of the local router that answered ("" in
	// process).
	Router string
	// Scores are each scorer's part in the winner's total under the pool's
	// worker chain (localrouter.ScorerSpec), in chain order; empty under
	// the default chain and Dynamo's, whose one term is ChainScore.
	Scores []Score
	// AllSaturated: every candidate's engine reported saturation (the
	// worker chain's saturation filter would have left none, so it chose
	// among all; SignalsReport.AllSaturated, on the wire's probe answer).
	// The global router's flow control reads it.
	AllSaturated bool
	// ReservationsHeld, in a reserving probe's answer only, is the
	// reservations of other requests the router held when it chose (the
	// wire's Selection.reservations_held): the global router in
	// probe.commit: reserve takes a count above 0 on any of several pools
	// as a contended decision.
	ReservationsHeld int
}

// Score is one scorer's part in a worker's total: its raw value, its
// weight and their product.
type Score struct {
	Name                      string
	Raw, Weight, Contribution float64
}

// CachedTokens is the prompt the worker already holds: OverlapBlocks
// blocks of BlockSize tokens.
func (s Selection) CachedTokens() int { return s.OverlapBlocks * s.BlockSize }

// UncachedTokens is the prompt the worker would have to prefill: ISL minus
// the cached tokens, never negative.
func (s Selection) UncachedTokens() int { return max(0, s.ISL-s.CachedTokens()) }

// Override changes a local router's cost parameters for one request; nil
// fields keep the router's values. OverlapScoreCredit and PrefillLoadScale
// are read by the worker chain's cost scorer only: under a chain without
// it (the default) they change nothing, and the router logs so once.
type Override struct {
	OverlapScoreCredit *float64
	PrefillLoadScale   *float64
	RouterTemperature  *float64
}

// Validate refuses a value that is negative, NaN or infinite (a NaN cost
// orders nothing). A nil Override is valid.
func (o *Override) Validate() error {
	if o == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{
		{"overlap_score_credit", o.OverlapScoreCredit},
		{"prefill_load_scale", o.PrefillLoadScale},
		{"router_temperature", o.RouterTemperature},
	} {
		if f.v != nil && (!(*f.v >= 0) || math.IsInf(*f.v, 0)) { // NaN fails >= 0
			return fmt.Errorf("override %s %g must be a finite number ≥ 0", f.name, *f.v)
		}
	}
	return nil
}

// AddressAllowed reports whether a worker at addr (host:port) is admitted
// by an endpoint subset (the endpoint-picker protocol's subset hint, sent
// to local routers as allowed_addresses): addr is listed, or its host is
// listed without a port. An empty list restricts nothing; an empty addr is
// never admitted by a non-empty list.
func AddressAllowed(allowed []string, addr string) bool {
	if len(allowed) == 0 {
		return true
	}
	if addr == "" {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	for _, a := range allowed {
		a = strings.TrimSpace(a)
		if a == addr || (err == nil && a == host) {
			return true
		}
	}
	return false
}
