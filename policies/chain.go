package policies

import (
	"fmt"
	"slices"
	"strings"
)

// Chain runs policies in order, each ranking the previous one's answer.
// It is immutable and safe for concurrent use.
type Chain struct {
	policies []Policy
}

// NewChain returns a chain of ps, run in order.
func NewChain(ps ...Policy) *Chain {
	return &Chain{policies: slices.Clone(ps)}
}

// Policies returns the chain's policies in order.
func (c *Chain) Policies() []Policy { return slices.Clone(c.policies) }

// Step is one policy's answer, for explanations.
type Step struct {
	Policy string
	// Pools are the candidates' pools after the step, best first.
	Pools []string
}

// Trace records a chain run when passed to Rank.
type Trace struct {
	Steps []Step
}

// String renders the trace as "model-match → [a b]; cost → [b a]".
func (t *Trace) String() string {
	var b strings.Builder
	for i, s := range t.Steps {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s → [%s]", s.Policy, strings.Join(s.Pools, " "))
	}
	return b.String()
}

// Rank runs the chain over cands (which it does not modify) and returns the
// ranked candidates, best first. After the last policy, prefill pools not
// attached to a decode candidate are dropped: a prefill pool never serves a
// request alone. When nothing is left, the error wraps ErrNoCandidate and
// names the policy that dropped the last candidate. trace, when not nil,
// receives each step.
func (c *Chain) Rank(req *Request, cands []Candidate, trace *Trace) ([]Candidate, error) {
	cur := append(make([]Candidate, 0, len(cands)), cands...)
	for _, p := range c.policies {
		before := len(cur)
		next, err := p.Rank(req, cur)
		if err != nil {
			return nil, fmt.Errorf("policy %q: %w", p.Name(), err)
		}
		cur = next
		if trace != nil {
			trace.Steps = append(trace.Steps, Step{Policy: p.Name(), Pools: poolNames(cur)})
		}
		if len(cur) == 0 {
			return nil, fmt.Errorf("policy %q dropped all %d candidates: %w", p.Name(), before, ErrNoCandidate)
		}
	}
	out := cur[:0]
	for _, cd := range cur {
		if cd.Role != RolePrefill {
			out = append(out, cd)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("only prefill pools are left and no policy paired them with a decode pool: %w", ErrNoCandidate)
	}
	return out, nil
}

func poolNames(cs []Candidate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Pool
		if c.Prefill != nil {
			out[i] += "+" + c.Prefill.Pool
		}
	}
	return out
}
