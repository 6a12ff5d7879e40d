package extprocclient

import (
	"errors"
	"fmt"
	"time"

	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/proto"
)

// Envoy's defaults for the settings the client reproduces.
const (
	// DefaultMessageTimeout is ExternalProcessor.message_timeout's default.
	DefaultMessageTimeout = 200 * time.Millisecond
	// DefaultBufferLimit is the listener's per_connection_buffer_limit_bytes
	// default, which bounds BUFFERED bodies.
	DefaultBufferLimit = 1 << 20
	// DefaultStatusOnError is status_on_error's default.
	DefaultStatusOnError = 500
	// maxHeadersCount and maxHeadersBytes are the HTTP connection manager's
	// default header limits (max_headers_count, max_request_headers_kb).
	maxHeadersCount = 100
	maxHeadersBytes = 60 << 10
)

// Config mirrors the fields of Envoy's ExternalProcessor filter config
// (envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor) that the
// client reproduces. The zero value is Envoy's default filter: request and
// response headers sent, bodies and trailers not, 200 ms message timeout,
// fail-closed, default mutation rules, no metadata forwarded or accepted.
type Config struct {
	// ProcessingMode is processing_mode; nil means Envoy's default (headers
	// SEND, body NONE, trailers SKIP). Header and trailer DEFAULT mean SEND
	// for headers and SKIP for trailers, as in Envoy. BUFFERED_PARTIAL and
	// GRPC body modes are not supported.
	ProcessingMode *extprocfilterv3.ProcessingMode
	// MessageTimeout is message_timeout; 0 means DefaultMessageTimeout.
	MessageTimeout time.Duration
	// MaxMessageTimeout is max_message_timeout; 0 disables
	// override_message_timeout.
	MaxMessageTimeout time.Duration
	// FailureModeAllow is failure_mode_allow (fail open).
	FailureModeAllow bool
	// StatusOnError is status_on_error's code; 0 means 500.
	StatusOnError int
	// MutationRules is mutation_rules; nil means the default rules.
	MutationRules *mutationrulesv3.HeaderMutationRules
	// ForwardingNamespaces is metadata_options.forwarding_namespaces.untyped:
	// the dynamic metadata namespaces sent as metadata_context.
	ForwardingNamespaces []string
	// ReceivingNamespaces is metadata_options.receiving_namespaces.untyped:
	// the only namespaces the server may write dynamic metadata into.
	ReceivingNamespaces []string
	// AllowModeOverride is allow_mode_override.
	AllowModeOverride bool
	// DisableImmediateResponse is disable_immediate_response.
	DisableImmediateResponse bool
	// DisableClearRouteCache is disable_clear_route_cache.
	DisableClearRouteCache bool
	// BufferLimit bounds a BUFFERED body, as the listener's
	// per_connection_buffer_limit_bytes does; 0 means DefaultBufferLimit.
	BufferLimit int
}

// FromFilterConfig converts an ExternalProcessor filter config, as it
// appears in a bootstrap, into a Config. It refuses settings whose behaviour
// the client does not reproduce rather than ignoring them silently.
func FromFilterConfig(p *extprocfilterv3.ExternalProcessor) (Config, error) {
	if err := p.ValidateAll(); err != nil {
		return Config{}, fmt.Errorf("ext_proc filter config: %w", err)
	}
	var c Config
	if p.GetProcessingMode() != nil {
		c.ProcessingMode = proto.Clone(p.GetProcessingMode()).(*extprocfilterv3.ProcessingMode)
	}
	c.MessageTimeout = p.GetMessageTimeout().AsDuration()
	c.MaxMessageTimeout = p.GetMaxMessageTimeout().AsDuration()
	c.FailureModeAllow = p.GetFailureModeAllow()
	c.StatusOnError = int(p.GetStatusOnError().GetCode())
	if p.GetMutationRules() != nil {
		c.MutationRules = proto.Clone(p.GetMutationRules()).(*mutationrulesv3.HeaderMutationRules)
	}
	c.ForwardingNamespaces = append(c.ForwardingNamespaces, p.GetMetadataOptions().GetForwardingNamespaces().GetUntyped()...)
	c.ReceivingNamespaces = append(c.ReceivingNamespaces, p.GetMetadataOptions().GetReceivingNamespaces().GetUntyped()...)
	c.AllowModeOverride = p.GetAllowModeOverride()
	c.DisableImmediateResponse = p.GetDisableImmediateResponse()
	c.DisableClearRouteCache = p.GetDisableClearRouteCache()
	var unsupported []string
	if p.GetObservabilityMode() {
		unsupported = append(unsupported, "observability_mode")
	}
	if p.GetSendBodyWithoutWaitingForHeaderResponse() {
		unsupported = append(unsupported, "send_body_without_waiting_for_header_response")
	}
	if p.GetHttpService() != nil {
		unsupported = append(unsupported, "http_service")
	}
	if len(p.GetAllowedOverrideModes()) > 0 {
		unsupported = append(unsupported, "allowed_override_modes")
	}
	if p.GetRouteCacheAction() != extprocfilterv3.ExternalProcessor_DEFAULT {
		unsupported = append(unsupported, "route_cache_action")
	}
	if p.GetAllowContentLengthHeader() {
		unsupported = append(unsupported, "allow_content_length_header")
	}
	if len(unsupported) > 0 {
		return Config{}, fmt.Errorf("ext_proc filter config: not reproduced by the client: %v", unsupported)
	}
	return c, c.Validate()
}

// Validate reports settings Envoy refuses at config load and settings the
// client does not reproduce.
func (c Config) Validate() error {
	var errs []error
	m := c.mode()
	for _, d := range []struct {
		name    string
		body    extprocfilterv3.ProcessingMode_BodySendMode
		trailer extprocfilterv3.ProcessingMode_HeaderSendMode
	}{
		{"request", m.GetRequestBodyMode(), m.GetRequestTrailerMode()},
		{"response", m.GetResponseBodyMode(), m.GetResponseTrailerMode()},
	} {
		switch d.body {
		case extprocfilterv3.ProcessingMode_NONE, extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED:
		case extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
			// Envoy's config.cc: FULL_DUPLEX_STREAMED needs trailers SEND.
			if d.trailer != extprocfilterv3.ProcessingMode_SEND {
				errs = append(errs, fmt.Errorf("%s_body_mode FULL_DUPLEX_STREAMED requires %s_trailer_mode SEND", d.name, d.name))
			}
		default:
			errs = append(errs, fmt.Errorf("%s_body_mode %s is not reproduced by the client", d.name, d.body))
		}
	}
	if c.MessageTimeout < 0 || c.MaxMessageTimeout < 0 {
		errs = append(errs, errors.New("message timeouts must not be negative"))
	}
	if c.StatusOnError != 0 && (c.StatusOnError < 200 || c.StatusOnError > 599) {
		errs = append(errs, fmt.Errorf("status_on_error %d out of range", c.StatusOnError))
	}
	if c.BufferLimit < 0 {
		errs = append(errs, errors.New("buffer limit must not be negative"))
	}
	if _, err := newChecker(c.MutationRules); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mode returns the processing mode with Envoy's defaults filled in.
func (c Config) mode() *extprocfilterv3.ProcessingMode {
	m := &extprocfilterv3.ProcessingMode{}
	if c.ProcessingMode != nil {
		m = proto.Clone(c.ProcessingMode).(*extprocfilterv3.ProcessingMode)
	}
	return m
}

func (c Config) messageTimeout() time.Duration {
	if c.MessageTimeout == 0 {
		return DefaultMessageTimeout
	}
	return c.MessageTimeout
}

func (c Config) bufferLimit() int {
	if c.BufferLimit == 0 {
		return DefaultBufferLimit
	}
	return c.BufferLimit
}

func (c Config) statusOnError() int {
	if c.StatusOnError == 0 {
		return DefaultStatusOnError
	}
	return c.StatusOnError
}
