// Command custompolicy is kvgate with a pool policy and a worker scorer of
// its own, added to the built-ins through app's options instead of a copy
// of a process's Run: every kvgate subcommand works as in the shipped
// binary, and the configuration may name the two new entries.
//
//	go run ./examples/custompolicy policy check examples/custompolicy/pools.yaml
//	go run ./examples/custompolicy extproc --config examples/custompolicy/pools.yaml
//	go run ./examples/custompolicy localrouter -pool a -worker-chain saturation,fewest-requests=1 ...
package main

import (
	"cmp"
	"context"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/kvgate/kvgate/app"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/policies"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Main(ctx, os.Args[1:], options()...)
	stop()
	os.Exit(code)
}

// options are what this program adds to kvgate.
func options() []app.Option {
	return []app.Option{
		app.WithPolicy("least-decode", newLeastDecode),
		app.WithScorer("fewest-requests", newFewestRequests),
	}
}

// leastDecode is a pool policy: it ranks the pools by their best worker's
// decode load with the request (fewest KV blocks first), stably, so the
// policies before it break its ties. It takes no arguments.
type leastDecode struct{}

var _ policies.Policy = leastDecode{}

func newLeastDecode(a policies.Args) (policies.Policy, error) {
	var none struct{}
	if err := a.DecodeChain(&none); err != nil { // strict: any argument is an error
		return nil, err
	}
	return leastDecode{}, nil
}

// Name implements policies.Policy.
func (leastDecode) Name() string { return "least-decode" }

// Rank implements policies.Policy.
func (leastDecode) Rank(_ *policies.Request, cands []policies.Candidate) ([]policies.Candidate, error) {
	slices.SortStableFunc(cands, func(a, b policies.Candidate) int {
		return cmp.Compare(a.Probe.DecodeBlocks, b.Probe.DecodeBlocks)
	})
	return cands, nil
}

// fewestRequests is a worker-chain scorer: a worker's raw value is its
// requests in flight (lower is better), whatever they cost.
type fewestRequests struct{}

var _ localrouter.Scorer = fewestRequests{}

func newFewestRequests(*localrouter.ChainArgs) (localrouter.Scorer, error) {
	return fewestRequests{}, nil
}

// Score implements localrouter.Scorer.
func (fewestRequests) Score(in *localrouter.ChainInput, cand []int, out []float64) {
	for k, j := range cand {
		out[k] = float64(in.Loads[j].ActiveRequests)
	}
}
