package policies

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
)

// Built-in policy names (continued).
const (
	NameWeighted        = "weighted"
	NameSessionAffinity = "session-affinity"
)

var (
	_ Policy = (*Weighted)(nil)
	_ Policy = (*SessionAffinity)(nil)
)

// Weighted splits traffic by the pools' weights (pool `weight`, default 1),
// for A/B tests and canaries: over many requests a pool ranks first in
// proportion to its weight. The order is a weighted random permutation
// seeded by the request id (Efraimidis–Spirakis keys), so one request always
// ranks the same way and its fallbacks follow the weights too. Scorer; no
// arguments.
type Weighted struct{}

func newWeighted(a Args) (Policy, error) {
	if err := noArgs(a.Chain, fmt.Sprintf("policy %q", a.Policy)); err != nil {
		return nil, err
	}
	if _, err := DecodePools(a, struct{}{}); err != nil {
		return nil, err
	}
	return Weighted{}, nil
}

// Name implements Policy.
func (Weighted) Name() string { return NameWeighted }

// Rank implements Policy.
func (Weighted) Rank(req *Request, cands []Candidate) ([]Candidate, error) {
	key := func(c Candidate) float64 {
		w := c.Weight
		if !(w > 0) {
			return math.Inf(1)
		}
		// u in (0, 1]; the smallest -ln(u)/w ranks first.
		u := (float64(hash2(req.ID, c.Pool)>>11) + 1) / (1 << 53)
		return -math.Log(u) / w
	}
	slices.SortStableFunc(cands, func(a, b Candidate) int { return cmp.Compare(key(a), key(b)) })
	return cands, nil
}

// SessionAffinity keeps a session on one pool: requests with the same
// session key (x-kvgate-session-id) rank the pools in the same order, by
// rendezvous hashing of the key with each pool's name, so a pool leaving
// moves only its own sessions. Requests without a session key keep the
// order they came with. Put it last to make sessions sticky; earlier to use
// it only as a tie-break. Scorer; no arguments.
type SessionAffinity struct{}

func newSessionAffinity(a Args) (Policy, error) {
	if err := noArgs(a.Chain, fmt.Sprintf("policy %q", a.Policy)); err != nil {
		return nil, err
	}
	if _, err := DecodePools(a, struct{}{}); err != nil {
		return nil, err
	}
	return SessionAffinity{}, nil
}

// Name implements Policy.
func (SessionAffinity) Name() string { return NameSessionAffinity }

// Rank implements Policy.
func (SessionAffinity) Rank(req *Request, cands []Candidate) ([]Candidate, error) {
	if req.SessionKey == "" {
		return cands, nil
	}
	slices.SortStableFunc(cands, func(a, b Candidate) int {
		return cmp.Compare(hash2(req.SessionKey, b.Pool), hash2(req.SessionKey, a.Pool))
	})
	return cands, nil
}

// hash2 hashes two strings with a separator (FNV-1a, then a 64-bit
// finaliser so that nearby inputs spread).
func hash2(a, b string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(a))
	h.Write([]byte{0})
	h.Write([]byte(b))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
