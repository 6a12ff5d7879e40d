package gateway

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/envoy"
	"github.com/kvgate/kvgate/envoy/extprocclient"
)

// DestinationHeader is the Gateway API Inference Extension header that
// carries the chosen endpoint(s): "ip:port" or a comma list, first first.
// It is also the key of the list in the envoy.lb dynamic metadata.
const DestinationHeader = "x-gateway-destination-endpoint"

// ServedHeader is the envoy.lb metadata key that reports the endpoint that
// actually served the request, forwarded on the response path.
const ServedHeader = "x-gateway-destination-endpoint-served"

// Config configures a Gateway.
type Config struct {
	// Filter is the ext_proc filter's configuration. DefaultConfig fills it
	// from the shipped bootstrap (envoy/bootstrap.yaml).
	Filter extprocclient.Config
	// Transport reaches the workers; nil means a dedicated http.Transport
	// (HTTP/1.1, pooled), closed by Gateway.Close.
	Transport http.RoundTripper
	// ReadChunk is the size of the reads that become body chunks, as a codec
	// delivers them; 0 means 16 KiB.
	ReadChunk int
	// DefaultUpstream (host:port) serves requests the ext_proc server
	// passes through without a destination (GET /v1/models and other
	// non-inference paths), as an Envoy route of their own would; "" means
	// they get 503. Never taken from the client.
	DefaultUpstream string
	// UpstreamHTTP2 makes the Gateway-owned transport speak cleartext
	// HTTP/2 with prior knowledge (h2c) to the workers, many streams over
	// one connection, as an Envoy cluster with http2_protocol_options does.
	// Off by default: vLLM (uvicorn) serves HTTP/1.1 only. Ignored when
	// Transport is set.
	UpstreamHTTP2 bool
	// MaxRequestHeadersBytes answers 431 to a request whose headers are
	// larger (0: DefaultMaxRequestHeadersBytes); BodyTimeout answers 408
	// to a request whose body takes longer to arrive (0:
	// DefaultBodyTimeout; negative: none). edges.go.
	MaxRequestHeadersBytes int
	BodyTimeout            time.Duration
}

// MaxConcurrentStreams is the HTTP/2 stream limit per connection that
// ConfigureServer sets and the h2c upstream transport expects (Go's
// default is 250; Envoy's is 2^31-1).
const MaxConcurrentStreams = 1000

// ConfigureServer makes srv, the gateway's listener, accept cleartext
// HTTP/2 with prior knowledge (h2c) as well as HTTP/1.1, as Envoy's
// listener with an http_connection_manager codec_type AUTO does, with
// MaxConcurrentStreams streams per connection.
func ConfigureServer(srv *http.Server) {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Protocols = &p
	if srv.HTTP2 == nil {
		srv.HTTP2 = &http.HTTP2Config{}
	}
	srv.HTTP2.MaxConcurrentStreams = MaxConcurrentStreams
}

// DefaultConfig returns the configuration matching the shipped bootstrap:
// the same ext_proc filter settings Envoy runs with.
func DefaultConfig() (Config, error) {
	f, err := envoy.ClientConfig()
	if err != nil {
		return Config{}, err
	}
	return Config{Filter: f}, nil
}

// Gateway is an http.Handler that does, for each request, what Envoy with
// the shipped bootstrap does: run the request through the ext_proc server
// (extprocclient), proxy it to the endpoint in x-gateway-destination-endpoint
// (trying the fallbacks of the envoy.lb metadata list on a connection
// failure), stream the response back through the ext_proc server, and
// answer immediate responses itself.
// It is safe for concurrent use.
type Gateway struct {
	client    *extprocclient.Client
	transport http.RoundTripper
	owned     *http.Transport
	chunk     int
	fallback  string // Config.DefaultUpstream
	log       *slog.Logger
	maxHeader int
	bodyTime  time.Duration
	rate      rateLog
}

var _ http.Handler = (*Gateway)(nil)

// New returns a Gateway whose ext_proc server is reached over conn. It does
// not block. Close releases its upstream connections.
func New(conn grpc.ClientConnInterface, cfg Config, logger *slog.Logger) (*Gateway, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "gateway")
	c, err := extprocclient.New(conn, cfg.Filter, logger)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g := &Gateway{client: c, transport: cfg.Transport, chunk: cfg.ReadChunk, fallback: cfg.DefaultUpstream, log: logger,
		maxHeader: cfg.MaxRequestHeadersBytes, bodyTime: cfg.BodyTimeout}
	if g.maxHeader <= 0 {
		g.maxHeader = DefaultMaxRequestHeadersBytes
	}
	if g.bodyTime == 0 {
		g.bodyTime = DefaultBodyTimeout
	}
	if g.chunk <= 0 {
		g.chunk = 16 << 10
	}
	if g.transport == nil {
		g.owned = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			// Envoy passes the body as is; so does the gateway.
			DisableCompression: true,
		}
		if cfg.UpstreamHTTP2 {
			var p http.Protocols
			p.SetUnencryptedHTTP2(true)
			g.owned.Protocols = &p
			// More streams than one connection's limit open another
			// connection (not StrictMaxConcurrentStreams).
			g.owned.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: MaxConcurrentStreams}
		}
		g.transport = g.owned
	}
	return g, nil
}

// Close closes idle upstream connections of a Gateway-owned transport.
func (g *Gateway) Close() {
	if g.owned != nil {
		g.owned.CloseIdleConnections()
	}
}

// hopByHop are connection-specific headers a proxy never forwards.
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "proxy-authenticate": true,
	"proxy-authorization": true,
}

// ServeHTTP proxies one request. It blocks until the exchange is over.
//
// An upstream that fails is never left hanging on either side: a failure
// to connect (or a reset before response headers) is answered with
// Envoy's local reply 503 and reported to the filter as that response's
// headers with the endpoint tried in the served-endpoint metadata; an
// upstream that breaks mid-response resets the client's stream at once
// (as Envoy does) and ends the ext_proc stream, so the router frees the
// request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if headerBytes(r) > g.maxHeader {
		tooLarge(w, g.maxHeader)
		return
	}
	body := g.boundBody(w, r)
	ctx, cancel := context.WithCancel(r.Context())
	// The ext_proc server may answer while the request body still streams.
	_ = http.NewResponseController(w).EnableFullDuplex()

	s := g.client.Open(ctx, nil)
	var wg sync.WaitGroup
	defer func() {
		// Ending the stream and the context unblocks every pump.
		s.Close()
		cancel()
		wg.Wait()
	}()

	noBody := r.ContentLength == 0 && len(r.TransferEncoding) == 0
	if err := s.SendRequestHeaders(ctx, requestHeaders(r), noBody); err != nil {
		return
	}
	if !noBody {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = g.pumpBody(ctx, r.Body, func() http.Header { return r.Trailer }, s.SendRequestData, s.SendRequestTrailers)
			if body.expired() {
				cancel() // the client stopped sending: end the exchange
			}
		}()
	}

	first, err := s.ReadUpstream(ctx)
	if errors.Is(err, extprocclient.ErrLocalReply) {
		g.writeDownstream(ctx, w, s)
		return
	}
	if err != nil {
		g.bodyTimedOut(w, r, body)
		return
	}
	resp, details, tried, err := g.roundTrip(ctx, r, s, first, &wg)
	if err != nil && g.bodyTimedOut(w, r, body) {
		return
	}
	if err != nil && s.Info().LocalReply != nil {
		// The filter answered while the body was on its way upstream (the
		// upstream request was aborted): the client gets that answer.
		g.writeDownstream(ctx, w, s)
		return
	}
	if err != nil {
		g.warn(r.Context(), "upstream failed", "path", r.URL.Path, "endpoint", tried, "details", details, "error", err)
		g.upstreamFailed(ctx, w, s, tried, details)
		return
	}
	defer resp.Body.Close()

	respNoBody := resp.ContentLength == 0 || r.Method == http.MethodHead
	if err := s.SendResponseHeaders(ctx, responseHeaders(resp), respNoBody); err != nil {
		return
	}
	var broken atomic.Bool
	if !respNoBody {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.pumpBody(ctx, resp.Body, func() http.Header { return resp.Trailer }, s.SendResponseData, s.SendResponseTrailers); err != nil && ctx.Err() == nil {
				// The upstream broke mid-response: what Envoy calls an
				// upstream reset after response started. End everything now
				// rather than wait for the client to give up.
				g.warn(r.Context(), "upstream reset mid-response", "path", r.URL.Path, "error", err)
				broken.Store(true)
				cancel()
			}
		}()
	}
	g.writeDownstream(ctx, w, s)
	if broken.Load() {
		// Envoy resets the client's stream (HTTP/1.1: the connection closes
		// without the terminating chunk); the deferred Close ends the
		// ext_proc stream, which frees the request on the router.
		panic(http.ErrAbortHandler)
	}
}

// upstreamFailed answers a request whose upstream could not be reached as
// Envoy does: the local reply 503 with Envoy's body, written as is. Unlike
// Envoy ≥ 1.34 (which sends local replies to no filter), the gateway first
// tells the filter: response headers with the local reply's status, end of
// stream, and the endpoint tried as the served endpoint (envoy.lb
// metadata), so the ext_proc server sees which worker failed rather than a
// stream that just ends. What the filter does with them is not applied.
func (g *Gateway) upstreamFailed(ctx context.Context, w http.ResponseWriter, s *extprocclient.Stream, endpoint, details string) {
	code, _ := localReply(details)
	if endpoint != "" {
		s.SetDynamicMetadata("envoy.lb", &structpb.Struct{Fields: map[string]*structpb.Value{
			ServedHeader: structpb.NewStringValue(endpoint),
		}})
	}
	h := extprocclient.Headers{{Key: ":status", Value: strconv.Itoa(code)}, {Key: "content-type", Value: "text/plain"}}
	if s.SendResponseHeaders(ctx, h, true) == nil {
		for {
			f, err := s.ReadDownstream(ctx)
			if err != nil || f.EndStream {
				break
			}
		}
	}
	writeLocalReply(w, code, details)
}

// pumpBody feeds a body to the filter, one chunk per read, then trailers or
// an empty end-of-stream chunk. It returns the body's read error (the
// client or upstream went away), nil once the body is fed or the filter
// stopped taking it.
func (g *Gateway) pumpBody(ctx context.Context, body io.Reader, trailer func() http.Header,
	data func(context.Context, []byte, bool) error, trailers func(context.Context, extprocclient.Headers) error) error {
	buf := make([]byte, g.chunk)
	for {
		n, err := body.Read(buf)
		eof := errors.Is(err, io.EOF)
		if err != nil && !eof {
			return err
		}
		var t extprocclient.Headers
		if eof {
			t = toHeaders(trailer())
		}
		if n > 0 || (eof && t == nil) {
			if data(ctx, buf[:n], eof && t == nil) != nil {
				return nil
			}
		}
		if eof {
			if t != nil {
				_ = trailers(ctx, t)
			}
			return nil
		}
	}
}

// roundTrip sends the request the filter released to the chosen endpoint,
// trying the next one of the list on a connection failure.
// It returns the response, or Envoy's response details of the failure and
// the last endpoint tried.
func (g *Gateway) roundTrip(ctx context.Context, r *http.Request, s *extprocclient.Stream, first extprocclient.Frame, wg *sync.WaitGroup) (*http.Response, string, string, error) {
	h := first.Headers
	endpoints := destinations(h, s.Info())
	if len(endpoints) == 0 && g.fallback != "" {
		endpoints = []string{g.fallback}
	}
	if len(endpoints) == 0 {
		return nil, "no_healthy_upstream", "", errors.New("no destination endpoint")
	}
	method, _ := h.Get(":method")
	path, _ := h.Get(":path")
	authority, _ := h.Get(":authority")
	base, err := http.NewRequestWithContext(ctx, method, "http://"+endpoints[0]+path, nil)
	if err != nil {
		return nil, "invalid_request", "", err
	}
	base.Host = authority
	base.ContentLength = -1
	for _, f := range h {
		if strings.HasPrefix(f.Key, ":") || hopByHop[f.Key] {
			continue
		}
		if f.Key == "content-length" {
			if n, err := strconv.ParseInt(f.Value, 10, 64); err == nil {
				base.ContentLength = n
			}
			continue
		}
		base.Header.Add(f.Key, f.Value)
	}
	if first.EndStream {
		base.Body, base.ContentLength = http.NoBody, 0
	} else {
		if len(r.Trailer) > 0 {
			base.Trailer = http.Header{}
			for k := range r.Trailer {
				base.Trailer[k] = nil
			}
		}
		pr, pw := io.Pipe()
		base.Body = io.NopCloser(pr) // survives a failed dial for the next endpoint
		trailer := base.Trailer
		wg.Add(1)
		go func() {
			defer wg.Done()
			pw.CloseWithError(pumpUpstream(ctx, s, pw, trailer))
		}()
		context.AfterFunc(ctx, func() { pr.CloseWithError(context.Canceled) })
	}
	var lastErr error
	for _, ep := range endpoints {
		req := base.Clone(ctx)
		req.URL.Host = ep
		// Clone copies the map; the pump fills base's.
		req.Body, req.Trailer = base.Body, base.Trailer
		resp, err := g.transport.RoundTrip(req)
		if err == nil {
			// The Inference Extension's "served" report: the response
			// path's messages tell the picker which endpoint answered.
			s.SetDynamicMetadata("envoy.lb", &structpb.Struct{Fields: map[string]*structpb.Value{
				ServedHeader: structpb.NewStringValue(ep),
			}})
			g.log.Debug("proxied", "path", path, "endpoint", ep, "status", resp.StatusCode)
			return resp, "", ep, nil
		}
		lastErr = err
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			return nil, "upstream_reset_before_response_started{connection_termination}", ep, err
		}
		g.log.Debug("endpoint unreachable, trying the next", "endpoint", ep, "error", err)
	}
	return nil, "upstream_reset_before_response_started{connection_failure}", endpoints[len(endpoints)-1], lastErr
}

// pumpUpstream copies the filter's released request body into the
// upstream request; trailers are set before the body ends.
func pumpUpstream(ctx context.Context, s *extprocclient.Stream, w io.Writer, trailer http.Header) error {
	for {
		f, err := s.ReadUpstream(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch f.Kind {
		case extprocclient.FrameData:
			if _, err := w.Write(f.Data); err != nil {
				return err
			}
		case extprocclient.FrameTrailers:
			for _, t := range f.Headers {
				if trailer != nil {
					trailer.Add(t.Key, t.Value)
				}
			}
		}
	}
}

// destinations returns the endpoints the ext_proc server chose, in order:
// the header's list, unless the envoy.lb metadata value is a longer list.
// kvgate puts the same ordered list (primary, then fallbacks) in both, as
// the endpoint-picker protocol requires; Envoy's override_host policy
// reads it for retries and the gateway tries the fallbacks the same way.
// Without the header the metadata list is used.
func destinations(h extprocclient.Headers, info extprocclient.Info) []string {
	v, _ := h.Get(DestinationHeader)
	out := splitEndpoints(v)
	md := splitEndpoints(info.DynamicMetadata["envoy.lb"].GetFields()[DestinationHeader].GetStringValue())
	if len(md) > len(out) {
		return md
	}
	return out
}

// splitEndpoints parses a comma list of endpoints, skipping empty items.
func splitEndpoints(v string) []string {
	var out []string
	for _, ep := range strings.Split(v, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}

// writeDownstream writes what the filter releases towards the client,
// flushing every chunk (streaming), until the response ends.
func (g *Gateway) writeDownstream(ctx context.Context, w http.ResponseWriter, s *extprocclient.Stream) {
	rc := http.NewResponseController(w)
	for {
		f, err := s.ReadDownstream(ctx)
		if errors.Is(err, extprocclient.ErrReset) {
			// Envoy resets the client's stream; so does the gateway.
			panic(http.ErrAbortHandler)
		}
		if err != nil {
			return
		}
		switch f.Kind {
		case extprocclient.FrameHeaders:
			code := http.StatusOK
			for _, h := range f.Headers {
				switch {
				case h.Key == ":status":
					if n, err := strconv.Atoi(h.Value); err == nil {
						code = n
					}
				case strings.HasPrefix(h.Key, ":") || hopByHop[h.Key]:
				default:
					w.Header().Add(h.Key, h.Value)
				}
			}
			w.WriteHeader(code)
			// Envoy encodes the response headers downstream as they pass
			// the filters, not with the first body chunk: a stream whose
			// worker has not produced a token yet already has its headers.
			_ = rc.Flush()
		case extprocclient.FrameData:
			if len(f.Data) > 0 {
				if _, err := w.Write(f.Data); err != nil {
					return
				}
			}
			_ = rc.Flush()
		case extprocclient.FrameTrailers:
			for _, h := range f.Headers {
				w.Header().Add(http.TrailerPrefix+h.Key, h.Value)
			}
		}
		if f.EndStream || f.Kind == extprocclient.FrameTrailers {
			return
		}
	}
}

// localReply is Envoy's local reply for an upstream failure: the status
// and body (the body names no address).
func localReply(details string) (int, string) {
	switch details {
	case "no_healthy_upstream":
		return http.StatusServiceUnavailable, "no healthy upstream"
	case "upstream_reset_before_response_started{connection_termination}":
		return http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
	}
	return http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. reset reason: connection failure"
}

// writeLocalReply answers as Envoy's own local replies do, without the
// filter (when the ext_proc stream is gone).
func writeLocalReply(w http.ResponseWriter, code int, details string) {
	_, body := localReply(details)
	w.Header().Set("content-type", "text/plain")
	w.Header().Set("content-length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

// requestHeaders renders r as Envoy's connection manager hands it to the
// filter: pseudo-headers first, lower-case keys, x-forwarded-proto and
// x-request-id added when absent.
func requestHeaders(r *http.Request) extprocclient.Headers {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	h := extprocclient.Headers{
		{Key: ":authority", Value: r.Host},
		{Key: ":path", Value: r.URL.RequestURI()},
		{Key: ":method", Value: r.Method},
		{Key: ":scheme", Value: scheme},
	}
	h = append(h, toHeaders(r.Header)...)
	if _, ok := h.Get("x-forwarded-proto"); !ok {
		h.Add("x-forwarded-proto", scheme)
	}
	if _, ok := h.Get("x-request-id"); !ok {
		h.Add("x-request-id", newRequestID())
	}
	return h
}

func responseHeaders(resp *http.Response) extprocclient.Headers {
	h := extprocclient.Headers{{Key: ":status", Value: strconv.Itoa(resp.StatusCode)}}
	h = append(h, toHeaders(resp.Header)...)
	if resp.ContentLength >= 0 {
		if _, ok := h.Get("content-length"); !ok {
			h.Add("content-length", strconv.FormatInt(resp.ContentLength, 10))
		}
	}
	return h
}

// toHeaders converts an http.Header, sorted by key for a stable order,
// without hop-by-hop headers. It returns nil when no value is set.
func toHeaders(hh http.Header) extprocclient.Headers {
	var out extprocclient.Headers
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range hh {
			if !yield(k) {
				return
			}
		}
	}) {
		lk := strings.ToLower(k)
		if hopByHop[lk] || lk == "te" && !slices.Contains(hh[k], "trailers") {
			continue
		}
		for _, v := range hh[k] {
			out = append(out, extprocclient.HeaderField{Key: lk, Value: v})
		}
	}
	return out
}

// newRequestID returns a random UUID v4, as Envoy generates x-request-id.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
