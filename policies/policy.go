package policies

import (
	"errors"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/membership"
)

// Role is what a pool's workers do: the one role type of kvgate, declared by
// package membership (worker records carry it too).
type Role = membership.Role

// Pool roles (membership's).
const (
	// RoleAggregated workers prefill and decode.
	RoleAggregated = membership.RoleAggregated
	// RolePrefill workers only prefill; they serve a request only as the
	// prefill half of a disaggregated pair (see Disaggregate).
	RolePrefill = membership.RolePrefill
	// RoleDecode workers decode, and prefill locally when no prefill
	// worker is used.
	RoleDecode = membership.RoleDecode
)

// Request is what a policy sees of the request being routed. It is read-only
// for policies.
type Request struct {
	// ID is the request id.
	ID    string
	Model string
	// Path is the request's HTTP path (/v1/chat/completions, ...; "" when
	// unknown, as in a subtree's view).
	Path string
	// ISL is the prompt length in tokens.
	ISL int
	// Headers are the request headers, keys lower-case. Read a header
	// through Header: the tenant header's value is the tenant the router
	// derived, which under tenancy.identity xfcc or jwt-claim need not be
	// in Headers at all.
	Headers map[string]string
	// TenantHeader is tenancy.header ("" without tenancy), and Tenant the
	// request's tenant as tenancy.identity derived it ("" for none): from
	// the header of a believed caller, the client certificate or the JWT
	// claim Envoy forwarded. Headers never hold another value under
	// TenantHeader.
	TenantHeader string
	Tenant       string
	// SessionKey groups requests of one conversation or user ("" none).
	SessionKey string
	// Priority: higher is more important (0 default).
	Priority int
	// SLO are the request's latency targets (zero: none given).
	SLO SLO
}

// Header is the value of the request header name (lower-case) and
// whether the request has it, the tenant header reading Tenant.
func (r *Request) Header(name string) (string, bool) {
	if name == r.TenantHeader && name != "" {
		return r.Tenant, r.Tenant != ""
	}
	v, ok := r.Headers[name]
	return v, ok
}

// SLO are latency targets a request asks for.
type SLO struct {
	// TTFT is the time-to-first-token target.
	TTFT time.Duration
	// ITL is the inter-token latency target.
	ITL time.Duration
}

// Health is a pool's health as the global router sees it.
type Health struct {
	// Routers is the number of the pool's local routers known; Available
	// those whose circuit is not open.
	Routers   int
	Available int
	// Recovering is set while the pool's circuit is half-open: the pool
	// answered after failing, and is on probation.
	Recovering bool
}

// Candidate is one pool as a routing target for one request: its static
// attributes and its probe result. Candidates are values; the fields
// reached through references (Models, Prefill) are shared and must not be
// modified.
type Candidate struct {
	Pool string
	Role Role
	// Models the pool serves.
	Models []string
	// Weight is the pool's configured weight (default 1).
	Weight float64
	Health Health
	// Probe is the pool's best worker for the request: what its local
	// router answered to the state-free BestWorker, with ISL set.
	Probe routing.Selection
	// Prefill is the prefill pool's candidate when the request is served
	// disaggregated (set by Disaggregate), nil otherwise.
	Prefill *Candidate
	// Disaggregation says why a decode candidate is, or is not, paired
	// with a prefill pool ("" when Disaggregate did not see it).
	Disaggregation string
}

// Policy ranks candidates.
//
// Rank returns cands narrowed (a filter drops candidates) or reordered (a
// scorer sorts, stably, so that the order it got breaks its ties), best
// first. It may reuse cands' backing array for its answer and may replace
// elements, but must not modify what elements share by reference. It does
// not block and is safe for concurrent use. It returns ErrNoCandidate (or an
// error wrapping it) to refuse every candidate with a reason — an empty
// answer means the same — or ErrSaturated to shed the request for load.
type Policy interface {
	// Name is the policy's registry name.
	Name() string
	Rank(req *Request, cands []Candidate) ([]Candidate, error)
}

var (
	// ErrNoCandidate: no candidate is left to route to (the global router
	// answers 503).
	ErrNoCandidate = errors.New("no candidate left")
	// ErrSaturated: a policy sheds the request because the candidates are
	// too loaded for it (e.g. its priority); the global router answers 429,
	// to be retried later.
	ErrSaturated = errors.New("candidates saturated")
	// ErrUnknownPolicy: a configuration names a policy the registry lacks.
	ErrUnknownPolicy = errors.New("unknown policy")
	// ErrDuplicate: a policy name registered twice, or a chain naming a
	// policy twice.
	ErrDuplicate = errors.New("duplicate policy")
	// ErrConfig: a configuration is invalid; the error names file, line,
	// policy and field.
	ErrConfig = config.ErrInvalid
)
