// Package extproc is kvgate's front door: the Envoy ExternalProcessor gRPC
// service (envoy.service.ext_proc.v3). Envoy opens one stream per HTTP
// request; for an inference request the server accumulates and parses the
// body once, asks a globalrouter.Decider where it should go, and answers
// Envoy with the routing headers, the whole ordered destination list
// (primary, then fallbacks) in the envoy.lb dynamic metadata namespace, and
// clear_route_cache. On the response path it drives the decision's Lease:
// the first response body chunk marks prefill complete, and the end of the
// response, an error status or the stream ending frees the request on its
// local router, exactly once.
//
// # Modes
//
// Request bodies: FULL_DUPLEX_STREAMED (the default; the server holds its
// header reply until the body is complete, then re-emits the body as it came,
// in chunks of at most MaxChunkBytes, the last with end_of_stream unless
// trailers end the request) or BUFFERED (headers answered at once, the
// routing headers ride on the body reply while Envoy still holds the
// headers). Other request body modes cannot route and are refused (500,
// unsupported_processing_mode). Response bodies: STREAMED,
// FULL_DUPLEX_STREAMED (chunks echoed) or BUFFERED. The modes come from the
// stream's protocol_config; Config says what to assume without one.
//
// # Headers
//
// Read: :path (routed when it is one of Config.InferencePaths, and the
// method is not GET or HEAD; anything else passes through untouched; by
// default OpenAI's /v1/completions, /v1/chat/completions and
// /v1/responses and Anthropic's /v1/messages, whose errors the server
// answers in Anthropic's shape, {"type":"error","error":{...}}),
// x-request-id (for logs only: the request's lifecycle on the local
// routers is keyed by an id the server makes per stream, as clients reuse
// theirs), x-kvgate-explain: 1, and every header for the policies
// (pinning with x-kvgate-pool / x-kvgate-worker-id / x-kvgate-dp-rank,
// sessions, priorities, overrides, the trust token: see globalrouter). The
// trust token's header is removed from every request before it goes
// upstream.
//
// Set on the request: x-gateway-destination-endpoint (the ordered list,
// primary ip:port then the distinct fallbacks, comma-separated: exactly
// the value of the envoy.lb metadata key x-gateway-destination-endpoint,
// as the endpoint-picker protocol requires; Config.HeaderFallbacks is a
// no-op), x-kvgate-pool, x-kvgate-worker-id, x-kvgate-dp-rank,
// x-data-parallel-rank (the rank for the engine: vLLM and SGLang read it;
// a client's own is replaced, and removed on pass-through),
// x-kvgate-overlap-blocks, x-prefiller-host-port (disaggregated; a client's
// own is removed) and x-kvgate-explain (when asked). For a pool with
// dp_rank_body_field (Decision.DPRankBodyField) the JSON body is re-emitted
// with SGLang's routed_dp_rank set to the rank, and for a tenant's request
// (Decision.CacheSalt, globalrouter's tenancy) with cache_salt set to the
// tenant's salt (the client's own inside it), so the engine's prefix cache
// is partitioned as the router's index (both: content-length fixed in
// BUFFERED mode). Set on the response, only when the decision says the
// caller may see them (globalrouter's trust.routing_headers; off by
// default): the same x-kvgate-* plus x-kvgate-endpoint (the endpoint that
// served the request, see below).
//
// # Endpoint-picker protocol (epp.go)
//
// The Gateway API Inference Extension's protocol v1.0.0: a subset hint in
// the request's metadata_context (envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset) becomes globalrouter.Request.Subset,
// which bounds the primary and every fallback (none eligible: 503
// no_endpoint_in_subset). The served report on any response message
// (envoy.lb / x-gateway-destination-endpoint-served), when it names a
// fallback, moves the request's lifecycle there (globalrouter.Mover). gRPC
// health answers for liveness, readiness and
// envoy.service.ext_proc.v3.ExternalProcessor (the last two follow the
// Decider's Ready, when it has one). docs/envoy.md maps each clause to its
// test.
//
// Passive health: a served report naming a fallback means the endpoints
// before it refused connections, and Envoy's local reply "503 upstream
// connect error" means the primary did: both are reported to the Decider
// when it is a globalrouter.HealthReporter.
//
// # Errors
//
// OpenAI-shaped JSON immediate responses ({"error":{"message","type",
// "code"}}) with x-kvgate-dropped-reason: 400 bad_json / missing_field /
// bad_field / duplicate_key (a key named twice in one object, unless
// Config.DuplicateKeys reads it last-wins as the engine does) / bad_request
// / pin_refused, 403 untrusted_header / untrusted_identity /
// missing_identity / bad_identity (globalrouter's tenancy.identity) /
// policy_refused, 404 unknown_model, 413 body_too_large, 429 saturated,
// 503 no_pool_reachable / no_pool_allowed / no_endpoint_in_subset (429 and
// 503 with retry-after), 500 internal_error. The Decider returns the
// globalrouter sentinels; this package is the only place they become
// statuses. Messages are globalrouter.ClientMessage's (no internal
// addresses); the whole error goes to the debug log.
//
// # Metrics
//
// kvgate_extproc_requests_total{pool,code},
// kvgate_extproc_decision_duration_seconds, kvgate_extproc_overlap_blocks
// {pool}, kvgate_extproc_tokens_total{pool,kind} (from the responses' usage,
// SSE parsed across chunks) and kvgate_extproc_streams_active, on the
// registry the caller injects.
//
// # Files
//
// server.go (Server, New, Config, Register, Serve), config.go (Config,
// Defaults, Validate), stream.go (one ext_proc exchange: the request and
// response phases), lifecycle.go (its lease: prefill complete off the
// stream's goroutine, free once, after it), body.go (parsing a request body), bodymode.go (what the
// body modes share) with bodymode_buffered.go, bodymode_streamed.go,
// bodymode_fullduplex.go and bodymode_other.go, reply.go (immediate
// responses: HTTP errors in OpenAI's or Anthropic's shape, 413, routing
// headers, built in one batch: headerBatch), usage.go (token usage from the responses of every API), epp.go (the endpoint-picker protocol: subset, served
// endpoint, health), metrics.go (requests, decisions, overlap, tokens,
// streams), bounds.go (the stream bounds: concurrent streams, time to a
// complete request, idle time before the response; refusals counted in
// kvgate_extproc_streams_refused_total{reason}), identity.go (whether the
// caller's client certificate was verified: Request.PeerVerified; the
// jwt_authn metadata is kept with the subset hint, epp.go). The process that serves it (flags, TLS
// files, the admin listener) is internal/extprocd. Tests: server_test.go,
// server_body_test.go, server_errors_test.go, server_lifecycle_test.go,
// apis_test.go (the Responses and Messages paths), bounds_test.go,
// identity_test.go (tenants from XFCC and JWT claims over the wire).
package extproc
