package extproc

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/lib/sse"
)

// exchange is the state machine of one ext_proc stream. It runs on the
// stream's goroutine only. It holds no context of its own: the stream's
// (stream.Context(), grpc-go's per-stream context) bounds every call.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	log    *slog.Logger

	reqMode, respMode bodyMode
	router            routingMode // reqMode, once the request is to be routed
	modesKnown        bool

	// Request side.
	path        string
	headers     map[string]string
	passThrough bool
	chunks      [][]byte
	size        int
	trailers    bool // request trailers arrived (FDS: they end the body)
	decided     bool
	subset      *globalrouter.Subset // the gateway's endpoint subset hint (nil: none)
	jwtAuthn    *structpb.Struct     // the jwt_authn filter's metadata (nil: none; identity.go)

	// Decision and lifecycle. current is the endpoint the request is
	// accounted on: the primary, or the fallback the data plane reports
	// served it (servedSeen once a report was read).
	decision   *globalrouter.Decision
	current    globalrouter.Endpoint
	servedSeen bool
	explain    bool
	lease      globalrouter.Lease
	prefilled  bool
	freed      bool
	// prefilling is closed once the prefill-complete call, made off the
	// stream's goroutine, has returned (nil: none in flight): the free
	// waits for it, so the two reach the local router in order.
	prefilling chan struct{}
	// id is the request's id on the local routers (made here, one per
	// stream); clientID the client's x-request-id, for logs only.
	id, clientID string
	// localReply503: the response is a 503 that may be Envoy's own
	// "upstream connect error" reply; its first body chunk says.
	localReply503 bool

	// Response side.
	code      string // HTTP status for kvgate_extproc_requests_total
	counted   bool
	sse       *sse.Parser
	usageBuf  []byte // non-streamed response, for its usage
	usageOver bool
	usage     Usage
	hasUsage  bool
	// responseStarted: response headers arrived; bounds: the stream's
	// watch (nil when unbounded; bounds.go).
	responseStarted bool
	bounds          *bounds
}

func newExchange(s *Server, stream extprocv3.ExternalProcessor_ProcessServer) *exchange {
	return &exchange{
		s:        s,
		stream:   stream,
		log:      s.log,
		reqMode:  s.reqMode,
		respMode: s.respMode,
	}
}

// errDone ends run without an error: the exchange answered with an
// immediate response and Envoy will not send more.
var errDone = errors.New("exchange done")

// errNoHeaders ends a stream whose request body or trailers came before
// its headers, which Envoy never does.
var errNoHeaders = status.Error(codes.FailedPrecondition, "ext_proc request body or trailers before the request headers")

func (x *exchange) run() error {
	for {
		req, err := x.stream.Recv()
		if err != nil {
			if err == io.EOF || status.Code(err) == codes.Canceled || x.stream.Context().Err() != nil {
				return nil // Envoy ended the stream: the request is over
			}
			return err
		}
		if !x.modesKnown {
			x.modesKnown = true
			if pc := req.GetProtocolConfig(); pc != nil {
				x.reqMode, x.respMode = bodyModeOf(pc.GetRequestBodyMode()), bodyModeOf(pc.GetResponseBodyMode())
			}
		}
		err = x.handle(req)
		x.noteMessage()
		if errors.Is(err, errDone) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (x *exchange) handle(req *extprocv3.ProcessingRequest) error {
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders, *extprocv3.ProcessingRequest_RequestBody, *extprocv3.ProcessingRequest_RequestTrailers:
		x.noteRequestMetadata(req)
	default:
		x.noteServed(req)
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.requestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return x.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return x.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return x.responseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return x.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return x.responseTrailers()
	default:
		return status.Errorf(codes.InvalidArgument, "unexpected ext_proc message %T", req.Request)
	}
}

func (x *exchange) send(r *extprocv3.ProcessingResponse) error {
	if err := x.stream.Send(r); err != nil {
		if x.stream.Context().Err() != nil {
			return errDone
		}
		return err
	}
	return nil
}

// reply sends an immediate response and ends the exchange.
func (x *exchange) reply(e *httpError) error {
	x.code = strconv.Itoa(e.status)
	x.count("")
	x.log.Debug("request refused", "path", x.path, "request_id", x.id, "client_request_id", x.clientID, "status", e.status, "reason", e.reason, "msg", e.msg, "err", e.detail)
	if err := x.send(e.immediate(x.path)); err != nil {
		return err
	}
	return errDone
}

// --- request path ---

func (x *exchange) requestHeaders(h *extprocv3.HttpHeaders) error {
	x.headers = make(map[string]string, len(h.GetHeaders().GetHeaders()))
	var method string
	for _, hv := range h.GetHeaders().GetHeaders() {
		k := strings.ToLower(hv.GetKey())
		v := string(hv.GetRawValue())
		if v == "" {
			v = hv.GetValue()
		}
		switch k {
		case ":path":
			x.path = v
		case ":method":
			method = v
		}
		if _, dup := x.headers[k]; !dup {
			x.headers[k] = v
		}
	}
	path := x.path
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	x.path = path
	if !x.s.paths[path] || method == "GET" || method == "HEAD" {
		x.passThrough = true
		return x.send(headersResponse(false, passThroughMutation(x.s.trustHeader())))
	}
	if h.GetEndOfStream() {
		return x.reply(bodyHTTPError(&bodyError{reasonMissingField, "request body is required"}))
	}
	rm, ok := x.reqMode.(routingMode)
	if !ok {
		return x.reply(&httpError{500, "server_error", "unsupported_processing_mode", "unsupported_processing_mode",
			"ext_proc request body mode " + x.reqMode.mode().String() + " cannot route; configure FULL_DUPLEX_STREAMED or BUFFERED", 0, nil})
	}
	x.router = rm
	return rm.requestHeaders(x)
}

func (x *exchange) requestBody(b *extprocv3.HttpBody) error {
	if x.passThrough || x.decided {
		return x.reqMode.pass(x, b, true)
	}
	if x.router == nil {
		return errNoHeaders
	}
	if len(b.GetBody()) > 0 {
		x.chunks = append(x.chunks, b.GetBody())
		x.size += len(b.GetBody())
	}
	if x.size > x.s.cfg.MaxBodyBytes {
		return x.reply(tooLarge(x.s.cfg.MaxBodyBytes))
	}
	if x.router.bodyComplete(b) {
		return x.route()
	}
	return nil
}

func (x *exchange) requestTrailers() error {
	if x.passThrough || x.decided {
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	if x.router == nil {
		return errNoHeaders
	}
	x.trailers = true
	if err := x.route(); err != nil {
		return err
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}})
}

// route parses the complete body, decides, and answers Envoy with the
// routing headers and metadata as the request body mode says.
func (x *exchange) route() error {
	x.decided = true
	body := joinChunks(x.chunks, x.size)
	// The lifecycle on the local routers is keyed by an id of the
	// server's own, one per stream: clients reuse x-request-id, and two
	// requests sharing one must count as two (issue 13).
	x.id, x.clientID = newRequestID(), x.headers["x-request-id"]
	greq := &globalrouter.Request{Path: x.path, Headers: x.headers, Subset: x.subset, BodyBytes: x.size, ID: x.id, ClientID: x.clientID,
		JWTAuthn: x.jwtAuthn, PeerVerified: peerVerified(x.stream.Context())}
	if v := x.headers[globalrouter.HeaderExplain]; v == "1" || strings.EqualFold(v, "true") {
		greq.Explain, x.explain = true, true
	}
	if _, err := parseBody(x.path, body, greq, x.s.cfg.DuplicateKeys); err != nil {
		var be *bodyError
		if errors.As(err, &be) {
			return x.reply(bodyHTTPError(be))
		}
		return err
	}

	start := time.Now()
	d, err := x.s.decider.Decide(x.stream.Context(), greq)
	x.s.m.decision.Observe(time.Since(start).Seconds())
	if err != nil {
		if x.stream.Context().Err() != nil {
			return errDone // Envoy gave up on the request meanwhile
		}
		e := x.s.errorFor(err)
		if e.status == 500 {
			x.log.Error("decision failed", "request_id", greq.ID, "client_request_id", x.clientID, "err", err)
		}
		return x.reply(e)
	}
	x.decision, x.lease, x.current = d, d.Lease, d.Primary
	x.s.m.overlap.WithLabelValues(d.Primary.Pool).Observe(float64(d.Primary.OverlapBlocks))
	// The endpoint-picker protocol: the header and the envoy.lb metadata
	// carry the same value, the ordered list (primary, then fallbacks).
	dest := destination(d)
	_, hadPrefiller := x.headers[globalrouter.HeaderPrefiller]
	x.explain = x.explain && d.Expose
	common := &extprocv3.CommonResponse{
		HeaderMutation:  routingHeaders(d, dest, x.explain, hadPrefiller, x.s.trustHeader()),
		ClearRouteCache: true,
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			globalrouter.HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
	x.log.Debug("routed", "request_id", greq.ID, "client_request_id", x.clientID, "best_effort", d.BestEffort, "pool", d.Primary.Pool, "worker", d.Primary.WorkerID,
		"dp_rank", d.Primary.DPRank, "overlap_blocks", d.Primary.OverlapBlocks, "destination", dest)
	if x.explain && d.Explanation != "" {
		x.log.Info("decision explained", "request_id", greq.ID, "client_request_id", x.clientID, "explanation", d.Explanation)
	}

	var rank *uint32
	if d.DPRankBodyField { // SGLang's body field, for pools that ask
		rank = &d.Primary.DPRank
	}
	if rank != nil || d.CacheSalt != "" {
		if err := x.rewriteBody(common, body, rank, d.CacheSalt); err != nil {
			return err
		}
	}
	return x.router.sendRoute(x, common, md)
}

// rewriteBody rewrites the request body with SGLang's routed_dp_rank set
// to *rank (when rank is set) and cache_salt set to salt (when set, the
// tenant's combined salt: Decision.CacheSalt): the body re-emitted in
// FULL_DUPLEX_STREAMED (x.chunks), or replaced by a body mutation in
// BUFFERED, where Envoy keeps content-length and it must match.
func (x *exchange) rewriteBody(common *extprocv3.CommonResponse, body []byte, rank *uint32, salt string) error {
	nb, err := withBodyFields(body, rank, salt)
	if err != nil {
		return err // parseBody accepted it as an object: cannot happen
	}
	x.chunks = [][]byte{nb}
	if _, ok := x.router.(buffered); ok {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: nb}}
		if _, ok := x.headers["content-length"]; ok {
			common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, setHeader("content-length", strconv.Itoa(len(nb))))
		}
	}
	return nil
}

// --- response path ---

func (x *exchange) responseHeaders(h *extprocv3.HttpHeaders) error {
	x.responseStarted = true
	if x.decision == nil {
		return x.send(headersResponse(true, nil))
	}
	var ctype string
	x.code = "200"
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := string(hv.GetRawValue())
		if v == "" {
			v = hv.GetValue()
		}
		switch strings.ToLower(hv.GetKey()) {
		case ":status":
			x.code = v
		case "content-type":
			ctype = v
		}
	}
	x.count(x.current.Pool)
	if x.code == "503" && !h.GetEndOfStream() && !x.servedSeen {
		x.localReply503 = true
	}
	if st, err := strconv.Atoi(x.code); err != nil || st >= 400 || h.GetEndOfStream() {
		x.free()
	} else if strings.HasPrefix(strings.ToLower(ctype), "text/event-stream") {
		x.sse = sse.NewParser(x.s.cfg.MaxUsageBytes, x.onSSE)
	}
	var mut *extprocv3.HeaderMutation
	if x.decision.Expose {
		mut = responseHeaders(x.decision, x.current, x.explain)
	}
	return x.send(headersResponse(true, &extprocv3.CommonResponse{HeaderMutation: mut}))
}

// connectFailures reports to the Decider's passive health (when it is a
// globalrouter.HealthReporter) what the served endpoint says: the
// endpoints of the list tried before it refused connections; the primary
// serving re-admits it.
func (x *exchange) connectFailures(served string) {
	hr, ok := x.s.decider.(globalrouter.HealthReporter)
	if !ok {
		return
	}
	d := x.decision
	if served == d.Primary.Address {
		hr.Served(d.Primary.Pool, served)
		return
	}
	tried := append([]globalrouter.Endpoint{d.Primary}, d.Fallbacks...)
	i := slices.IndexFunc(tried, func(e globalrouter.Endpoint) bool { return e.Address == served })
	if i < 0 {
		// Served from outside the list (override_host fell back to its
		// round robin, e.g. while the cluster's hosts lag the workers'):
		// nothing says the listed endpoints refused anything.
		return
	}
	for _, e := range tried[:i] {
		hr.ConnectFailed(e.Pool, e.Address)
	}
}

// workerConnectFailure reports whether a local reply's body blames the
// upstream worker: Envoy's "upstream connect error ... reset reason: X"
// with X a connection failure, timeout or termination. An overflow is
// Envoy's own circuit breaker, a local reset Envoy's own doing: neither
// says anything about the worker's health.
func workerConnectFailure(body []byte) bool {
	if !bytes.HasPrefix(body, []byte("upstream connect error")) {
		return false
	}
	for _, reason := range []string{"connection failure", "connection timeout", "connection termination"} {
		if bytes.Contains(body, []byte("reset reason: "+reason)) {
			return true
		}
	}
	return false
}

// localReplyConnectFailure reports the primary when a 503's body is
// Envoy's local reply to a connection failure (the upstream never
// answered, so the worker is at fault, not the request).
func (x *exchange) localReplyConnectFailure(body []byte) {
	x.localReply503 = false
	if !workerConnectFailure(body) {
		return
	}
	if hr, ok := x.s.decider.(globalrouter.HealthReporter); ok {
		hr.ConnectFailed(x.decision.Primary.Pool, x.decision.Primary.Address)
	}
}

// responseBody passes the first chunk on before telling the local router
// prefill is complete, so the client's first token never waits for the
// router's acknowledgement. The end of the response frees the request
// before its last bytes go out: a client that sends its next request at
// once finds the load already released.
func (x *exchange) responseBody(b *extprocv3.HttpBody) error {
	if x.localReply503 && x.decision != nil {
		x.localReplyConnectFailure(b.GetBody())
	}
	var prefilled bool
	if x.decision != nil && !x.freed {
		if !x.prefilled && (len(b.GetBody()) > 0 || b.GetEndOfStream()) {
			x.prefilled, prefilled = true, true
		}
		x.readUsage(b.GetBody())
		if b.GetEndOfStream() {
			if prefilled { // the whole response in one chunk
				x.leaseCall("prefill complete", x.lease.PrefillComplete)
				prefilled = false
			}
			x.endResponse()
		}
	}
	if err := x.respMode.pass(x, b, false); err != nil {
		return err
	}
	if prefilled {
		// Off the stream's goroutine: the call waits for the router's
		// acknowledgement, and the response's next chunks, its end (and
		// so the free) among them, must not queue behind that round trip
		// (under CPU pressure it held each request's free for hundreds of
		// milliseconds after its engine had finished; BENCHMARKS.md "Per
		// request").
		done := make(chan struct{})
		x.prefilling = done
		lease, ep := x.lease, x.current
		go func() {
			defer close(done)
			x.leaseCallOn(ep, "prefill complete", lease.PrefillComplete)
		}()
	}
	return nil
}

func (x *exchange) responseTrailers() error {
	if x.decision != nil && !x.freed {
		x.endResponse()
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

func (x *exchange) readUsage(b []byte) {
	if x.sse != nil {
		x.sse.Write(b)
		return
	}
	if x.usageOver {
		return
	}
	if len(x.usageBuf)+len(b) > x.s.cfg.MaxUsageBytes {
		x.usageBuf, x.usageOver = nil, true
		return
	}
	x.usageBuf = append(x.usageBuf, b...)
}

func (x *exchange) onSSE(data []byte) {
	if u, ok := usageOf(data, x.usage); ok {
		x.usage, x.hasUsage = u, true // the last usage is the total
	}
}

// endResponse runs at the end of a routed response: usage into metrics,
// then the request is freed.
func (x *exchange) endResponse() {
	if x.sse != nil {
		x.sse.Close()
	} else if !x.usageOver && len(x.usageBuf) > 0 {
		x.usage, x.hasUsage = usageOf(x.usageBuf, Usage{})
		x.usageBuf = nil
	}
	if x.hasUsage {
		pool := x.current.Pool
		x.s.m.tokens.WithLabelValues(pool, "prompt").Add(float64(max(0, x.usage.PromptTokens)))
		x.s.m.tokens.WithLabelValues(pool, "completion").Add(float64(max(0, x.usage.CompletionTokens)))
		x.hasUsage = false
	}
	x.free()
}

// --- helpers ---

// passThroughMutation removes the routing headers a client may have sent:
// Envoy's ORIGINAL_DST cluster reads x-gateway-destination-endpoint
// unsanitised, so a client could otherwise pick any upstream (an open
// proxy). Routed requests overwrite both instead.
func passThroughMutation(trustHeader string) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
		RemoveHeaders: []string{globalrouter.HeaderDestination, globalrouter.HeaderPrefiller, globalrouter.HeaderDataParallelRank, trustHeader},
	}}
}

func headersResponse(response bool, common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	hr := &extprocv3.HeadersResponse{Response: common}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: hr}}
}

func joinChunks(chunks [][]byte, size int) []byte {
	if len(chunks) == 1 {
		return chunks[0]
	}
	out := make([]byte, 0, size)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out
}

func newRequestID() string {
	const hex = "0123456789abcdef"
	var b [16]byte
	v := rand.Uint64()
	w := rand.Uint64()
	for i := 0; i < 8; i++ {
		b[i] = hex[(v>>(4*i))&0xf]
		b[8+i] = hex[(w>>(4*i))&0xf]
	}
	return "kvgate-" + string(b[:])
}
