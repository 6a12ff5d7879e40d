package globalrouter

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/tokenizer"
)

// Request is what the ext_proc server hands the global router for one
// inference request, after parsing the body once.
type Request struct {
	// ID is the request's id on the local routers: the lifecycle (commit,
	// prefill complete, free) is keyed by it, so it must be unique among
	// the requests in flight. The ext_proc server makes one per ext_proc
	// stream; "" makes the router make one.
	ID string
	// ClientID is the client's x-request-id, for logs and traces only:
	// clients reuse ids, and two requests sharing one must still count
	// as two.
	ClientID string
	// Path is the HTTP path (/v1/completions, /v1/chat/completions, ...).
	Path  string
	Model string
	// Prompt is the completion prompt text; PromptTokens a prompt given as
	// token ids. Chat is a chat request: its messages and everything else
	// that shapes the rendered prompt (tools, chat_template_kwargs, ...).
	// Exactly one of the three is set.
	Prompt       string
	PromptTokens []uint32
	Chat         *tokenizer.ChatRequest
	// CacheSalt is the body's cache_salt ("" for none): the request's
	// blocks are hashed with it, as the engine salts them.
	CacheSalt string
	// Headers are the request headers, keys lower-case (policies match on
	// them; x-kvgate-* pinning and override headers live here).
	Headers map[string]string
	// Explain asks for an explanation of the decision (x-kvgate-explain: 1).
	Explain bool
	// Subset, when set, is the endpoint subset the gateway allows (the
	// Inference Extension's subset hint): every endpoint of the decision
	// is in it, or Decide returns ErrNoEndpointInSubset (epp.go).
	Subset *Subset
	// BodyBytes is the size of the request body (0: unknown); past the
	// model's max_body_bytes Decide refuses with ErrBodyTooLarge.
	BodyBytes int
	// PeerVerified: the caller (the Envoy on the other end of the ext_proc
	// stream) presented a client certificate the server verified (mutual
	// TLS): it may vouch for the identity it forwards (tenancy.identity
	// xfcc and jwt-claim), as a trust token does.
	PeerVerified bool
	// JWTAuthn is the envoy.filters.http.jwt_authn namespace of the
	// dynamic metadata Envoy sent (metadata_context): provider → verified
	// JWT payload (tenancy.identity jwt-claim).
	JWTAuthn *structpb.Struct
	// ExtraKey is the body's extra_key, which SGLang appends to
	// cache_salt: with tenancy salting on, a request carrying one is
	// refused (it could spell another tenant's salt).
	ExtraKey string
}

// Endpoint is one routable target: a worker rank in a pool, as its local
// router chose it (Address is the worker's host:port,
// x-gateway-destination-endpoint).
type Endpoint struct {
	Pool string
	routing.Selection
}

// Decision is the outcome of routing one request.
type Decision struct {
	// Primary is where the request goes; Fallbacks, in order, where Envoy
	// may retry.
	Primary   Endpoint
	Fallbacks []Endpoint
	// Prefill is the prefill worker in a disaggregated topology, nil
	// otherwise (x-prefiller-host-port).
	Prefill *Endpoint
	// ISL is the prompt length in tokens; RequestBlocks per Primary's pool.
	ISL           int
	RequestBlocks int
	// TTFT is the local router's predicted time to first token of the
	// request alone on Primary (routing.Selection.TTFT; 0 when unknown):
	// flow control refuses a queued request whose remaining budget is
	// below it.
	TTFT time.Duration
	// Explanation says why Primary won (set when Request.Explain).
	Explanation string
	// DPRankBodyField: Primary's pool sets SGLang's routed_dp_rank body
	// field (pool.Config.DPRankBodyField); the ext_proc server rewrites
	// the body.
	DPRankBodyField bool
	// CacheSalt, when set, is the cache_salt the engine must receive in
	// the request body (vLLM's and SGLang's field): the salt the router
	// hashed the request's blocks with, its tenant's
	// (TenancyConfig.Salt) with the client's own cache_salt after it, so
	// the engine's prefix cache is partitioned exactly as the index. The
	// ext_proc server rewrites the body. "" leaves the body as it came.
	CacheSalt string
	// Expose says the routing headers (pool, worker, overlap, endpoint,
	// explanation) may go back to the client (TrustConfig.RoutingHeaders).
	Expose bool
	// explained is the explanation, kept for observers (a status page)
	// when Explanation is withheld from the client (observe.go).
	explained string
	// BestEffort: no local router of any eligible pool could be reached,
	// and Primary is a worker from the last known state (a recent probe's
	// answer, round robin); the request is not accounted on any router.
	BestEffort bool
	// Lease drives the request's lifecycle on the chosen local router.
	Lease Lease
}

// Lease is a request committed to a local router (Track stream open).
// Methods are safe for concurrent use and idempotent; Free after any error
// still frees. The ext_proc server calls PrefillComplete on the first
// response body chunk and Free at the end of the response, on an error
// status, or when the ext_proc stream ends.
type Lease interface {
	PrefillComplete(ctx context.Context) error
	Free(ctx context.Context) error
}

// Errors of Decide; the ext_proc server maps them to HTTP statuses.
var (
	// ErrBadRequest (400): the request cannot be routed as given.
	ErrBadRequest = errors.New("bad request")
	// ErrBodyTooLarge (413): the body is larger than the model's workers
	// accept (ModelConfig.MaxBodyBytes); refused before tokenizing.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrUnknownModel (404): no pool serves the model.
	ErrUnknownModel = errors.New("unknown model")
	// ErrSaturated (429): every eligible worker is saturated; retry later.
	ErrSaturated = errors.New("saturated")
	// ErrNoPool (503): no pool could be reached.
	ErrNoPool = errors.New("no pool reachable")
	// ErrPinRefused (400): pinning headers name a pool or worker that cannot
	// take the request; never silently re-routed.
	ErrPinRefused = errors.New("pinned target refused")
	// ErrForbidden (403): the caller may not do what the request asks: a
	// steering header from a caller that is not trusted, or a pinned
	// target that a policy of the chain filters out (tenancy, a reserved
	// priority tier, a strict SLO cell). The error names the header or
	// the policy.
	ErrForbidden = errors.New("forbidden")
	// ErrCommitRefused: the local router refused a commit the decision had
	// already sent (commits are pipelined, not waited for); the request
	// went to the worker the probe chose, unaccounted on its local router.
	// Lease.PrefillComplete returns it.
	ErrCommitRefused = errors.New("commit refused")
)

// Refusal is an error of Decide that carries a message fit for the
// client: the cause, named without internal addresses or the local
// routers' own words (Err keeps those, for logs). errors.Is matches its
// Kind (one of the sentinels above) and Err.
type Refusal struct {
	Kind error
	// Reason, when set, is the x-kvgate-dropped-reason (the ext_proc
	// server's default for the Kind otherwise).
	Reason string
	// Public is the message for the client.
	Public string
	// RetryAfter, when set, is when a retry may succeed (429, 503).
	RetryAfter time.Duration
	// TTFT, on flow control's saturated refusal, is the request's least
	// predicted time to first token among its pools (FlowNeed).
	TTFT time.Duration
	Err  error
}

func (r *Refusal) Error() string {
	s := r.Kind.Error() + ": " + r.Public
	if r.Err != nil {
		s += ": " + r.Err.Error()
	}
	return s
}

func (r *Refusal) Unwrap() []error {
	if r.Err == nil {
		return []error{r.Kind}
	}
	return []error{r.Kind, r.Err}
}

// ClientMessage is the message of a Decide error for the client: a
// Refusal's Public message (the cause, without internal addresses or the
// local routers' own words), else the error's text, which may name
// internal endpoints: the ext_proc server redacts addresses from it.
func ClientMessage(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Public
	}
	return err.Error()
}

// Decider makes routing decisions. Implementations are safe for concurrent
// use; Decide may block up to its probe deadline.
type Decider interface {
	Decide(ctx context.Context, req *Request) (*Decision, error)
}
