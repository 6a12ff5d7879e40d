package extproc

import (
	"errors"
	"fmt"
	"strings"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/tokenizer"
)

// Defaults of Config.
const (
	DefaultAddr            = config.DefaultExtprocAddr
	DefaultMaxBodyBytes    = 16 << 20
	DefaultRetryAfter      = time.Second
	DefaultLeaseTimeout    = 2 * time.Second
	DefaultMaxUsageBytes   = 1 << 20
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultReadinessInterval is how often readiness is refreshed.
	DefaultReadinessInterval = time.Second
	// MaxChunkBytes bounds each streamed_response chunk the server sends
	// in FULL_DUPLEX_STREAMED (Envoy recommends staying under 64 KiB).
	MaxChunkBytes = 62000
)

// DefaultInferencePaths are the paths routed by default: OpenAI's
// completions, chat completions and Responses, and Anthropic's Messages
// (tokenizer.ParseBody reads each); every other path passes through
// untouched.
var DefaultInferencePaths = []string{"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"}

// Config configures a Server. The zero value plus Defaults is usable.
type Config struct {
	// Addr is the gRPC listen address for ListenAndServe.
	Addr string
	// InferencePaths are the HTTP paths (without query) that are routed;
	// any other path passes through. Empty means DefaultInferencePaths.
	InferencePaths []string
	// MaxBodyBytes caps an accumulated request body; past it the request
	// is answered 413.
	MaxBodyBytes int
	// RequestBodyMode and ResponseBodyMode are assumed when Envoy sends no
	// protocol_config (older Envoys); newer ones say which modes they use.
	RequestBodyMode  extprocfilterv3.ProcessingMode_BodySendMode
	ResponseBodyMode extprocfilterv3.ProcessingMode_BodySendMode
	// RetryAfter is the retry-after of a 429 (saturated) and of a 503 (no
	// pool reachable, no endpoint in the subset), unless the refusal names
	// its own (globalrouter.Refusal.RetryAfter, e.g. flow control's).
	RetryAfter time.Duration
	// LeaseTimeout bounds each Lease call (prefill complete, free).
	LeaseTimeout time.Duration
	// MaxUsageBytes bounds how much of a non-streamed response body is
	// kept to read its usage, and the longest SSE line parsed.
	MaxUsageBytes int
	// ShutdownTimeout bounds the graceful stop of the gRPC server.
	ShutdownTimeout time.Duration
	// ReadinessInterval is how often the readiness health services
	// ("readiness" and the ExternalProcessor service) are refreshed from
	// the Decider.
	ReadinessInterval time.Duration
	// HeaderFallbacks is ignored: the x-gateway-destination-endpoint
	// header always carries the same ordered list as the envoy.lb metadata
	// (the endpoint-picker protocol forbids different values). Kept so Go
	// code setting it still compiles, and New logs a warning when it is set;
	// the -header-fallbacks flag is gone.
	//
	// Deprecated: a no-op.
	HeaderFallbacks bool
	// DuplicateKeys says how a request body that names a key twice in one
	// object is read: refused with 400 (the zero value,
	// tokenizer.DuplicatesRefuse: no reader after kvgate can then read it
	// another way), or as the engine reads it, the last occurrence at every
	// depth (tokenizer.DuplicatesLast). docs/security.md says why.
	DuplicateKeys tokenizer.DuplicateKeys
	// MaxStreams bounds concurrent ext_proc streams (RESOURCE_EXHAUSTED
	// past it); RequestTimeout the time from stream open to a complete
	// request; IdleTimeout the time with nothing received before the
	// response starts. 0 means the default (DefaultMaxStreams,
	// DefaultRequestTimeout, DefaultIdleTimeout), negative no bound
	// (bounds.go).
	MaxStreams     int
	RequestTimeout time.Duration
	IdleTimeout    time.Duration
}

// Defaults returns c with every unset field set to its default.
func (c Config) Defaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if len(c.InferencePaths) == 0 {
		c.InferencePaths = append([]string(nil), DefaultInferencePaths...)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.RequestBodyMode == extprocfilterv3.ProcessingMode_NONE {
		c.RequestBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	if c.ResponseBodyMode == extprocfilterv3.ProcessingMode_NONE {
		c.ResponseBodyMode = extprocfilterv3.ProcessingMode_STREAMED
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.LeaseTimeout == 0 {
		c.LeaseTimeout = DefaultLeaseTimeout
	}
	if c.MaxUsageBytes == 0 {
		c.MaxUsageBytes = DefaultMaxUsageBytes
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ReadinessInterval == 0 {
		c.ReadinessInterval = DefaultReadinessInterval
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	return c
}

// Validate reports settings the server cannot honour.
func (c Config) Validate() error {
	var errs []error
	for _, p := range c.InferencePaths {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#") {
			errs = append(errs, fmt.Errorf("inference path %q: must start with / and have no query", p))
		}
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes %d: must not be negative", c.MaxBodyBytes))
	}
	switch c.RequestBodyMode {
	case extprocfilterv3.ProcessingMode_NONE, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED:
	default:
		errs = append(errs, fmt.Errorf("request body mode %s: want FULL_DUPLEX_STREAMED or BUFFERED", c.RequestBodyMode))
	}
	switch c.ResponseBodyMode {
	case extprocfilterv3.ProcessingMode_NONE, extprocfilterv3.ProcessingMode_STREAMED,
		extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED:
	default:
		errs = append(errs, fmt.Errorf("response body mode %s: want STREAMED, FULL_DUPLEX_STREAMED or BUFFERED", c.ResponseBodyMode))
	}
	if c.RetryAfter < 0 || c.LeaseTimeout < 0 || c.ShutdownTimeout < 0 || c.MaxUsageBytes < 0 || c.ReadinessInterval < 0 {
		errs = append(errs, errors.New("durations and sizes must not be negative"))
	}
	return errors.Join(errs...)
}
