// Package extprocclient is an Envoy-faithful ext_proc client: it plays the
// part of Envoy's envoy.filters.http.ext_proc HTTP filter against an
// envoy.service.ext_proc.v3.ExternalProcessor server, so that kvgate's
// ext_proc server can be run and tested without an Envoy binary (the
// gateway in envoy/gateway, `kvgate up`, and end-to-end tests use it).
//
// A Client holds a Config that mirrors the filter's config (see
// FromFilterConfig to take it from a bootstrap). Client.Open starts a Stream,
// one per HTTP request, which behaves like the filter between the
// downstream codec and the router: the caller feeds request frames
// (headers, data chunks, trailers) and later the upstream's response frames;
// the Stream sends ProcessingRequests, applies ProcessingResponses with
// Envoy's rules, and releases frames towards the upstream (ReadUpstream) and
// the client (ReadDownstream). Client.Process is a buffered convenience over
// Open for tests:
//
//	c, _ := extprocclient.New(conn, extprocclient.Config{
//		ProcessingMode: &extprocfilterv3.ProcessingMode{
//			RequestBodyMode:    extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
//			RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND,
//		},
//		ReceivingNamespaces: []string{"envoy.lb"},
//	}, logger)
//	res, err := c.Process(ctx, extprocclient.Request{Message: extprocclient.Message{
//		Headers: extprocclient.Headers{{":method", "POST"}, {":path", "/v1/completions"}, ...},
//		Body:    [][]byte{body},
//	}})
//	// res.Upstream.Headers carries x-gateway-destination-endpoint and
//	// res.Info.DynamicMetadata["envoy.lb"] the same list (Destinations
//	// reads it), or res.Info.LocalReply the error the server answered with.
//
// # What it reproduces (Envoy ~1.35–1.37)
//
// Read from Envoy's source/extensions/filters/http/ext_proc/ (ext_proc.cc,
// processor_state.cc and .h, client_impl.cc, mutation_utils.cc, config.cc)
// and source/extensions/filters/common/mutation_rules/mutation_rules.cc;
// faithful_test.go lists the behaviours a naive client gets wrong with the
// function of Envoy's that shows each. Each body mode is one strategy
// (bodymode_*.go).
//
//   - One gRPC stream per HTTP request, opened lazily on the first message
//     (none at all if nothing is sent); request and response share it; it is
//     reset when the exchange ends (the server sees CANCELLED; Envoy's
//     half-close before the reset is not reproduced).
//   - Message order per direction headers → body → trailers;
//     protocol_config on the stream's first message only; metadata_context
//     with the forwarding namespaces on every message.
//   - Headers as Envoy sends them: lower-case keys, pseudo-headers,
//     values in raw_value only; end_of_stream on headers for a bodiless
//     message.
//   - Defaults headers SEND, body NONE, trailers SKIP; trailers sent only if
//     SEND and present.
//   - Body modes NONE, BUFFERED (whole body, end_of_stream=true, or =false
//     when trailers follow; 413 request / 500 response over the buffer
//     limit; headers held until the body reply), STREAMED (one message per
//     chunk, pipelined, one reply per chunk FIFO, data released only as
//     replies arrive), FULL_DUPLEX_STREAMED (chunks sent at once without
//     waiting for the header reply, original bytes drained, only
//     streamed_response bytes reach the peer, trailers SEND required by
//     config). Data arriving while the header reply is pending is held and
//     sent after it as one chunk.
//   - CommonResponse: CONTINUE, CONTINUE_AND_REPLACE (body replaced,
//     content-length removed, :method may change); set_headers with the
//     legacy append BoolValue only (unset = overwrite, append_action
//     ignored), raw_value only (value alone gives an empty header, both is
//     an error); invalid names/values and header limits (100 headers,
//     60 KiB) are errors.
//   - Mutation rules (default and the configurable ones: allow_all_routing,
//     allow_envoy, disallow_system, disallow_all, allow/disallow_expression,
//     disallow_is_error): host, :authority, :method, :scheme and x-envoy-*
//     not settable, :path and :status settable, no removal of ':' headers or
//     host, no append to ':' headers; refusals ignored and counted.
//   - header_mutation in a body reply applied only while headers are held
//     (BUFFERED); ignored for STREAMED and FULL_DUPLEX_STREAMED.
//   - content-length removed for STREAMED, FULL_DUPLEX_STREAMED and BUFFERED
//     with headers SKIP (a server's content-length skipped there); BUFFERED
//     with headers SEND checks it against the mutated body (error).
//   - clear_route_cache honoured only on the request path with a
//     header_mutation in the same response (Info.RouteCacheCleared).
//   - dynamic_metadata kept only for receiving namespaces (merged).
//   - mode_override on header replies with allow_mode_override, ignored when
//     either direction is configured FULL_DUPLEX_STREAMED.
//   - ImmediateResponse: local reply (status < 200 → 200, headers through
//     the mutation rules, grpc_status, details with spaces as '_'), stream
//     closed, later messages ignored; after response headers went
//     downstream: reset (ErrReset); spurious with disable_immediate_response.
//     Local replies are never sent to ext_proc.
//   - message_timeout per message awaiting a reply, none at all in a
//     FULL_DUPLEX_STREAMED direction, for its headers and trailers too
//     (ProcessorState::onStartProcessorCall); expiry → 504
//     ext_proc_error_per-message_timeout_exceeded, or continue when fail-open;
//     override_message_timeout once per call within max_message_timeout.
//   - Clean OK close → processing ends, request continues unmodified, even
//     fail-closed. gRPC error or unreachable server → status_on_error
//     (default 500) with details ext_proc_error_gRPC_error_<code>{msg}, or
//     continue when fail-open. Spurious messages (wrong reply type, reply
//     with nothing pending, plain body in FULL_DUPLEX_STREAMED,
//     streamed_response outside it) → status_on_error, or ignored with
//     processing stopped when fail-open. Fail-open does not apply once
//     FULL_DUPLEX_STREAMED body data has been sent.
//
// # What it does not reproduce
//
//   - BUFFERED_PARTIAL and GRPC body modes, observability_mode,
//     send_body_without_waiting_for_header_response, allowed_override_modes,
//     route_cache_action, allow_content_length_header, the HTTP (non-gRPC)
//     service, per-route ExtProcPerRoute overrides (Config.Validate and
//     FromFilterConfig refuse these).
//   - request_attributes/response_attributes (no attributes are sent),
//     typed dynamic metadata, forward_rules, processing_request_modifier,
//     the flow-control and drain fields, StreamedImmediateResponse.
//   - Watermark flow control: outputs are queued without bound; the gRPC
//     stream is HTTP/2 flow-controlled as usual.
//   - The route cache itself: Info.RouteCacheCleared only records that Envoy
//     would re-pick the route (the gateway re-reads headers anyway).
//   - After an OK close in FULL_DUPLEX_STREAMED the drained bytes are lost;
//     the direction is ended with what passed (Envoy's exact behaviour there
//     is not specified by the reference).
//   - Stats, tracing, access-log fields other than Info.
//
// Files: client.go (Client, New, Request, Result, Process), config.go
// (Config, FromFilterConfig: the filter's settings), dial.go (DialOptions),
// stream.go (Stream: one HTTP exchange through the filter), side.go (one
// direction's callback state, timer, mode), bodymode.go (what each body
// mode shares) with bodymode_none.go, bodymode_buffered.go,
// bodymode_streamed.go and bodymode_fullduplex.go (one mode each),
// response.go (the processor's answers: phase checks, mode override,
// dynamic metadata, route cache), mutation.go (header mutation rules),
// headers.go (HeaderField, Headers), frame.go (Frame, LocalReply, Info),
// failure.go (failure_mode_allow, gRPC errors, message timeouts), queue.go
// (the stream's event queue), epp.go (the endpoint-picker protocol: subset
// hint, destinations, served endpoint).
// Tests: faithful_test.go (the behaviours a naive client gets wrong:
// headers, mutation rules, route cache, metadata), faithful_body_test.go
// (bodies, content-length, mode overrides), faithful_failure_test.go
// (closes, errors, immediate responses, timeouts).
package extprocclient
