package policies

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/lib/config"
)

// Disaggregate pairs decode pools with a prefill pool, per request, when
// remote prefill pays: the prompt is long enough (min_isl_tokens), the
// decode worker lacks enough of it (uncached tokens ≥ threshold_tokens),
// the prefill pool is not backed up (its worker's queued prefill ≤
// max_prefill_queue_tokens, when set), and — with load_aware — the prefill
// worker would start it no later than the decode worker would:
//
//	remote wait = prefill worker's queued prefill + the prompt uncached there
//	local wait  = decode worker's queued prefill  + the prompt uncached there
//	            + decode_weight × the decode worker's other active decode tokens
//
// Both are read from the probes' cost terms (a Selection's PrefillTokens is
// the worker's queued prefill plus this request's uncached tokens;
// DecodeBlocks its active decode blocks with this request's). Otherwise the
// decode pool prefills locally, as it does for a path the P/D sidecar does
// not split (split_paths). Each decode candidate's Disaggregation
// says which rule decided and with which numbers. The best-ranked prefill
// pool is used, so rank before it. Prefill pools leave the ranking;
// aggregated pools stay as they are.
type Disaggregate struct {
	args DisaggregateArgs
}

// DefaultSplitPaths are the paths whose requests a decode worker's P/D
// sidecar splits into the prefill hop and the decode, by default:
// llm-d's routing sidecar intercepts /v1/chat/completions and
// /v1/completions and passes every other path to its decoder as it is
// (llm-d/llm-d-routing-sidecar internal/proxy/proxy.go, createRoutes,
// commit 0eeb28bb548235682d8553a879a35be3a336113e), which then prefills
// locally; so does kvgate's mocker. Newer sidecars
// (llm-d/llm-d-inference-scheduler pkg/sidecar/proxy) also split
// /v1/responses and /v1/messages: list them in split_paths when yours
// does.
var DefaultSplitPaths = []string{"/v1/chat/completions", "/v1/completions"}

// DisaggregateArgs are disaggregate's chain arguments.
type DisaggregateArgs struct {
	// ThresholdTokens: disaggregate only when the decode worker would have
	// to prefill at least this many tokens (512).
	ThresholdTokens int `yaml:"threshold_tokens"`
	// MinISLTokens: disaggregate only prompts at least this long (0).
	MinISLTokens int `yaml:"min_isl_tokens"`
	// MaxPrefillQueueTokens: prefill locally when the prefill worker has
	// more than this many tokens queued ahead of the request (0: no bound;
	// Dynamo's max_prefill_queue_size, in tokens).
	MaxPrefillQueueTokens int `yaml:"max_prefill_queue_tokens"`
	// LoadAware compares the remote and local waits above (true; false:
	// threshold-only, the behaviour before load counted).
	LoadAware *bool `yaml:"load_aware"`
	// DecodeWeight charges a local prefill for the decode work it stalls:
	// tokens of wait per token of the decode worker's other active decode
	// blocks (0).
	DecodeWeight float64 `yaml:"decode_weight"`
	// SplitPaths are the request paths the decode workers' P/D sidecar
	// splits (DefaultSplitPaths); a request on another path prefills
	// locally. A request of no known path (a subtree's view) may be split.
	SplitPaths []string `yaml:"split_paths"`
}

func newDisaggregate(a Args) (Policy, error) {
	args := DisaggregateArgs{ThresholdTokens: 512}
	what := fmt.Sprintf("policy %q", a.Policy)
	if err := a.DecodeChain(&args); err != nil {
		return nil, err
	}
	switch {
	case args.ThresholdTokens < 0:
		return nil, config.Errorf(a.Chain.File, a.Chain.Node, what, "threshold_tokens: got %d, want ≥ 0", args.ThresholdTokens)
	case args.MinISLTokens < 0:
		return nil, config.Errorf(a.Chain.File, a.Chain.Node, what, "min_isl_tokens: got %d, want ≥ 0", args.MinISLTokens)
	case args.MaxPrefillQueueTokens < 0:
		return nil, config.Errorf(a.Chain.File, a.Chain.Node, what, "max_prefill_queue_tokens: got %d, want ≥ 0 (0: no bound)", args.MaxPrefillQueueTokens)
	case !(args.DecodeWeight >= 0) || math.IsInf(args.DecodeWeight, 0):
		return nil, config.Errorf(a.Chain.File, a.Chain.Node, what, "decode_weight: got %g, want a number ≥ 0", args.DecodeWeight)
	}
	for i, p := range args.SplitPaths {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#") {
			return nil, config.Errorf(a.Chain.File, a.Chain.Node, what, "split_paths[%d]: got %q, want an HTTP path (/v1/...)", i, p)
		}
	}
	if _, err := DecodePools(a, struct{}{}); err != nil {
		return nil, err
	}
	return &Disaggregate{args: args}, nil
}

// NewDisaggregate returns a Disaggregate policy with the given threshold
// and the other arguments' defaults, for chains built in Go.
func NewDisaggregate(thresholdTokens int) *Disaggregate {
	return &Disaggregate{args: DisaggregateArgs{ThresholdTokens: thresholdTokens}}
}

// NewDisaggregateArgs returns a Disaggregate policy with args (a nil
// LoadAware is true), for chains built in Go.
func NewDisaggregateArgs(args DisaggregateArgs) *Disaggregate { return &Disaggregate{args: args} }

// Name implements Policy.
func (*Disaggregate) Name() string { return NameDisaggregate }

// Rank implements Policy.
func (d *Disaggregate) Rank(req *Request, cands []Candidate) ([]Candidate, error) {
	var prefill *Candidate
	for i := range cands {
		if cands[i].Role == RolePrefill {
			p := cands[i]
			prefill = &p
			break
		}
	}
	out := cands[:0]
	for _, c := range cands {
		switch c.Role {
		case RolePrefill:
			continue
		case RoleDecode:
			var remote bool
			remote, c.Disaggregation = d.decide(req, c, prefill)
			if remote {
				c.Prefill = prefill
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// decide reports whether decode candidate c should take its prefill from
// the prefill candidate p (nil: none reachable), and why.
func (d *Disaggregate) decide(req *Request, c Candidate, p *Candidate) (bool, string) {
	a := d.args
	if p == nil {
		return false, "no prefill pool reachable: prefill locally"
	}
	split := a.SplitPaths
	if split == nil {
		split = DefaultSplitPaths
	}
	if req != nil && req.Path != "" && !slices.Contains(split, req.Path) {
		return false, fmt.Sprintf("path %s is not split by the P/D sidecar (split_paths): prefill locally", req.Path)
	}
	isl := c.Probe.ISL
	if isl == 0 && req != nil {
		isl = req.ISL
	}
	if isl < a.MinISLTokens {
		return false, fmt.Sprintf("prompt %d tokens < min_isl_tokens %d: prefill locally", isl, a.MinISLTokens)
	}
	uncached := c.Probe.UncachedTokens()
	if uncached < a.ThresholdTokens {
		return false, fmt.Sprintf("uncached %d tokens on %s < threshold_tokens %d: prefill locally", uncached, c.Pool, a.ThresholdTokens)
	}
	pUncached := p.Probe.UncachedTokens()
	pQueue := max(0, p.Probe.PrefillTokens-pUncached)
	if a.MaxPrefillQueueTokens > 0 && pQueue > a.MaxPrefillQueueTokens {
		return false, fmt.Sprintf("prefill queue %d tokens on %s > max_prefill_queue_tokens %d: prefill locally", pQueue, p.Pool, a.MaxPrefillQueueTokens)
	}
	if a.LoadAware != nil && !*a.LoadAware {
		return true, fmt.Sprintf("uncached %d tokens on %s ≥ threshold_tokens %d: prefill on %s", uncached, c.Pool, a.ThresholdTokens, p.Pool)
	}
	remote := pQueue + pUncached
	lQueue := max(0, c.Probe.PrefillTokens-uncached)
	local := float64(lQueue + uncached)
	decode := ""
	if a.DecodeWeight > 0 {
		active := max(0, c.Probe.DecodeBlocks-c.Probe.RequestBlocks) * c.Probe.BlockSize
		local += a.DecodeWeight * float64(active)
		decode = fmt.Sprintf(" + decode_weight %g × %d active decode tokens", a.DecodeWeight, active)
	}
	why := fmt.Sprintf("remote wait %d tokens (queue %d + uncached %d on %s) vs local wait %.0f (queue %d + uncached %d on %s%s)",
		remote, pQueue, pUncached, p.Pool, local, lQueue, uncached, c.Pool, decode)
	if float64(remote) > local {
		return false, why + ": prefill locally"
	}
	return true, why + ": prefill on " + p.Pool
}
