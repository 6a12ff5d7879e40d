// Package extproc is kvgate's front door: the Envoy ExternalProcessor gRPC
// service (envoy.service.ext_proc.v3). Envoy opens one stream per HTTP
// request; for an inference request the server accumulates and parses the
// body once, asks a globalrouter.Decider where it should go, and answers
// Envoy with the routing headers (x-gateway-destination-endpoint and the
// x-kvgate-* family), the same destination in the envoy.lb dynamic metadata
// namespace, and clear_route_cache. On the response path it drives the
// decision's Lease: the first response body chunk marks prefill complete,
// and the end of the response, an error status or the stream ending frees
// the request on its local router, exactly once.
//
// Request bodies are handled in FULL_DUPLEX_STREAMED (the default; the
// server holds its header reply until the body is complete, then re-emits
// the body in chunks of at most 62,000 bytes) or BUFFERED mode. Response
// bodies may be STREAMED, FULL_DUPLEX_STREAMED or BUFFERED. Errors are
// OpenAI-shaped JSON immediate responses with x-kvgate-dropped-reason.
//
// Errors are translated to HTTP statuses here and nowhere else: the Decider
// returns the globalrouter sentinels, the server maps them (400, 404, 413,
// 429 with retry-after, 503).
package extproc
