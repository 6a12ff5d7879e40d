// Package gateway is a small HTTP gateway that stands in for Envoy with the
// shipped bootstrap (envoy/bootstrap.yaml) where no Envoy binary runs:
// `kvgate up` serves it on :8080, and end-to-end tests drive requests
// through it.
//
// For each request it does what that Envoy does: the request goes through
// kvgate's ext_proc server with the Envoy-faithful client
// (envoy/extprocclient) in the configured processing modes; the request the
// filter releases is proxied to the endpoint named in
// x-gateway-destination-endpoint; the response is streamed back through the
// ext_proc server; immediate responses and the filter's errors become the
// HTTP reply.
//
//	cfg, err := gateway.DefaultConfig() // the bootstrap's ext_proc settings
//	conn, err := grpc.NewClient("127.0.0.1:9002", grpc.WithTransportCredentials(insecure.NewCredentials()))
//	gw, err := gateway.New(conn, cfg, logger)
//	defer gw.Close()
//	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: gw}
//
// Where it differs from Envoy with the bootstrap:
//
//   - Fallbacks: the endpoints are the header's list, or the dynamic
//     metadata envoy.lb x-gateway-destination-endpoint list when that is
//     longer (kvgate puts the same ordered list in both, as the
//     endpoint-picker protocol requires). The first endpoint is used and
//     the next ones are tried on a connection failure (the Inference
//     Extension's fallback semantics, as Envoy's override_host policy has
//     them); the one that answered is reported as served (envoy.lb
//     x-gateway-destination-endpoint-served) on the response path.
//   - Upstreams are HTTP/1.1 (or what Config.Transport speaks), or h2c with
//     Config.UpstreamHTTP2 (Envoy's cluster http2_protocol_options); no
//     retries, no timeouts other than the client's context and the
//     filter's. ConfigureServer makes the listener accept h2c (prior
//     knowledge) besides HTTP/1.1, MaxConcurrentStreams streams per
//     connection, as Envoy's codec_type AUTO does.
//   - Only request trailers the client declared (Trailer header) are
//     forwarded upstream.
//   - Header handling is the connection manager's in outline only: hop-by-hop
//     headers dropped, x-forwarded-proto and x-request-id added when absent;
//     no x-envoy-* headers, no x-forwarded-for.
//   - Local replies for upstream failures use Envoy's bodies and, as in
//     Envoy ≥ 1.34, the filter does not change them; unlike Envoy, the
//     gateway first shows the filter response headers with the local
//     reply's status (503), end of stream, and the endpoint it tried as the
//     served endpoint (envoy.lb x-gateway-destination-endpoint-served), so
//     the ext_proc server sees which worker failed.
//   - An upstream that breaks mid-response resets the client's stream at
//     once, as Envoy does (HTTP/1.1: the connection closes before the
//     terminating chunk; before the headers if the filter had not released
//     them yet, whose pending frames are dropped as Envoy drops them), and
//     ends the ext_proc stream, so the router frees the request; a client
//     never waits for its own timeout.
//
// Files: gateway.go (Config, Gateway, New, ServeHTTP, Close), edges.go (431
// past the request header limit, 408 past the body timeout, rate-limited
// warnings).
package gateway
