package extprocclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// Errors a Stream's readers return.
var (
	// ErrLocalReply ends the upstream side when the filter answered the
	// request itself (immediate response, error, timeout): nothing more must
	// go upstream, and the downstream side carries the reply.
	ErrLocalReply = errors.New("extprocclient: request answered by a local reply")
	// ErrReset ends the downstream side when Envoy would reset the
	// downstream stream: a local reply was due after the response headers
	// had already gone downstream.
	ErrReset = errors.New("extprocclient: downstream stream reset")
	// ErrClosed is returned once the Stream is closed or its context ended.
	ErrClosed = errors.New("extprocclient: stream closed")
)

// Client drives ext_proc streams the way Envoy's ext_proc HTTP filter does,
// one stream per HTTP request. It is safe for concurrent use; each Stream it
// opens is one HTTP request.
type Client struct {
	cfg     Config
	ext     extprocv3.ExternalProcessorClient
	checker *checker
	log     *slog.Logger
}

// New returns a Client over conn, which must reach an
// envoy.service.ext_proc.v3.ExternalProcessor server. It does not block.
func New(conn grpc.ClientConnInterface, cfg Config, logger *slog.Logger) (*Client, error) {
	if conn == nil {
		return nil, errors.New("extprocclient: nil connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("extprocclient: %w", err)
	}
	ch, err := newChecker(cfg.MutationRules)
	if err != nil {
		return nil, fmt.Errorf("extprocclient: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Client{
		cfg:     cfg,
		ext:     extprocv3.NewExternalProcessorClient(conn),
		checker: ch,
		log:     logger.With("component", "extprocclient"),
	}, nil
}

// Config returns the client's configuration.
func (c *Client) Config() Config { return c.cfg }

// Message is one direction of an HTTP exchange, fully buffered.
type Message struct {
	Headers Headers
	// Body is the body as the codec delivered it, one chunk per data
	// callback. No chunks means the headers end the message (a GET).
	Body [][]byte
	// Trailers, when non-nil, follow the body.
	Trailers Headers
}

// BodyBytes returns the body's chunks joined.
func (m *Message) BodyBytes() []byte {
	var out []byte
	for _, b := range m.Body {
		out = append(out, b...)
	}
	return out
}

// Request is one HTTP request for Process.
type Request struct {
	Message
	// Metadata is the dynamic metadata present before the filter ran
	// (another filter's, e.g. envoy.lb subset hints); the namespaces in
	// Config.ForwardingNamespaces are sent to the server.
	Metadata map[string]*structpb.Struct
	// Upstream, when set, plays the upstream: it receives the request as
	// the filter let it through and returns the response, which then runs
	// through the filter's response path. When nil, Process stops once the
	// request has gone upstream.
	Upstream func(ctx context.Context, req *Message) (*Message, error)
	// Endpoint, when set (and Upstream is not), plays the upstream as
	// Envoy's override_host policy with connect-failure retries does: it
	// is called with each endpoint of the picker's destination list
	// (Destinations) in order until one does not fail with
	// ErrConnectFailure; that endpoint is reported as served (ReportServed)
	// before the response goes through the filter.
	Endpoint func(ctx context.Context, endpoint string, req *Message) (*Message, error)
}

// Result is what a Process call observed.
type Result struct {
	// Upstream is the request as it reached the upstream; nil when the
	// filter answered before the request headers went upstream.
	Upstream *Message
	// Downstream is the response the client received: the upstream's
	// response after the response path, or the local reply. Nil when
	// Request.Upstream is nil and the filter did not answer locally.
	Downstream *Message
	// Reset reports that Envoy would have reset the downstream stream.
	Reset bool
	// Info is what the filter recorded (metadata, route cache, counters).
	Info Info
}

// Process runs req through the filter and, if req.Upstream is set, its
// response back: a buffered convenience over Open for tests and tools. It
// blocks until the exchange ends or ctx is done. The error is non-nil only
// when the exchange could not be completed (ctx, Upstream's error); a local
// reply is a Result, not an error.
func (c *Client) Process(ctx context.Context, req Request) (*Result, error) {
	s := c.Open(ctx, req.Metadata)
	defer s.Close()
	res := &Result{}

	if err := sendMessage(ctx, s, &req.Message, s.SendRequestHeaders, s.SendRequestData, s.SendRequestTrailers); err != nil {
		return nil, err
	}
	up, err := collect(ctx, s.ReadUpstream)
	if up.Headers != nil {
		res.Upstream = up
	}
	switch {
	case errors.Is(err, ErrLocalReply):
		down, derr := collect(ctx, s.ReadDownstream)
		if derr != nil && !errors.Is(derr, ErrReset) {
			return nil, ctxErr(ctx, derr)
		}
		res.Downstream, res.Reset = down, errors.Is(derr, ErrReset)
		res.Info = s.Info()
		return res, nil
	case err != nil:
		return nil, ctxErr(ctx, err)
	}
	if req.Upstream == nil && req.Endpoint == nil {
		s.Close()
		res.Info = s.Info()
		return res, nil
	}
	var resp *Message
	if req.Upstream != nil {
		resp, err = req.Upstream(ctx, up)
	} else {
		resp, err = pickEndpoint(ctx, s, up, req.Endpoint)
	}
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if err := sendMessage(ctx, s, resp, s.SendResponseHeaders, s.SendResponseData, s.SendResponseTrailers); err != nil {
		return nil, err
	}
	down, err := collect(ctx, s.ReadDownstream)
	if err != nil && !errors.Is(err, ErrReset) {
		return nil, ctxErr(ctx, err)
	}
	res.Downstream, res.Reset = down, errors.Is(err, ErrReset)
	s.Close()
	res.Info = s.Info()
	return res, nil
}

func sendMessage(ctx context.Context, s *Stream, m *Message,
	headers func(context.Context, Headers, bool) error,
	data func(context.Context, []byte, bool) error,
	trailers func(context.Context, Headers) error,
) error {
	noBody := len(m.Body) == 0 && m.Trailers == nil
	if err := headers(ctx, m.Headers, noBody); err != nil {
		return ignoreClosed(err)
	}
	for i, b := range m.Body {
		if err := data(ctx, b, i == len(m.Body)-1 && m.Trailers == nil); err != nil {
			return ignoreClosed(err)
		}
	}
	if m.Trailers != nil {
		return ignoreClosed(trailers(ctx, m.Trailers))
	}
	return nil
}

// ctxErr prefers the context's error: a Stream closed by its context
// reports ErrClosed.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// ignoreClosed treats a stream that already finished (a local reply) as
// success for a writer: the reader reports the outcome.
func ignoreClosed(err error) error {
	if errors.Is(err, ErrClosed) {
		return nil
	}
	return err
}

// collect reads frames until the side ends. It returns what arrived and the
// error that ended the side (nil for a clean end).
func collect(ctx context.Context, read func(context.Context) (Frame, error)) (*Message, error) {
	m := &Message{}
	for {
		f, err := read(ctx)
		if errors.Is(err, io.EOF) {
			return m, nil
		}
		if err != nil {
			return m, err
		}
		switch f.Kind {
		case FrameHeaders:
			m.Headers = f.Headers
		case FrameData:
			if len(f.Data) > 0 || !f.EndStream {
				m.Body = append(m.Body, f.Data)
			}
		case FrameTrailers:
			m.Trailers = f.Headers
		}
	}
}
