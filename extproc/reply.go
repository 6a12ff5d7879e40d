package extproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/tokenizer"
)

// MetadataNamespace is the dynamic metadata namespace Envoy's
// override_host LB policy and the Inference Extension read. The header
// names the server reads and sets are globalrouter's (HeaderDestination,
// HeaderPool, ...), declared once there.
const MetadataNamespace = "envoy.lb"

// maxExplainBytes keeps the explanation header well under Envoy's header
// size limit.
const maxExplainBytes = 8 << 10

// httpError is an error answered with an ImmediateResponse.
type httpError struct {
	status     int
	errType    string // OpenAI error.type
	code       string // OpenAI error.code
	reason     string // x-kvgate-dropped-reason
	msg        string
	retryAfter time.Duration
	// detail is the whole error, for logs only (never to the client).
	detail error
}

// errorFor maps a Decide error to the HTTP answer (the only place the
// globalrouter sentinels become statuses). The client's message is
// globalrouter.ClientMessage's: the cause without internal addresses.
func (s *Server) errorFor(err error) *httpError {
	msg := redactAddresses(globalrouter.ClientMessage(err))
	var e *httpError
	switch {
	case errors.Is(err, globalrouter.ErrForbidden):
		e = &httpError{403, "permission_error", "forbidden", "forbidden", msg, 0, err}
	case errors.Is(err, globalrouter.ErrPinRefused):
		e = &httpError{400, "invalid_request_error", "pin_refused", "pin_refused", msg, 0, err}
	case errors.Is(err, globalrouter.ErrBadRequest):
		e = &httpError{400, "invalid_request_error", "bad_request", "bad_request", msg, 0, err}
	case errors.Is(err, globalrouter.ErrBodyTooLarge):
		e = &httpError{413, "invalid_request_error", "request_too_large", "body_too_large", msg, 0, err}
	case errors.Is(err, globalrouter.ErrUnknownModel):
		e = &httpError{404, "invalid_request_error", "model_not_found", "unknown_model", msg, 0, err}
	case errors.Is(err, globalrouter.ErrSaturated):
		e = &httpError{429, "rate_limit_error", "rate_limit_exceeded", "saturated", msg, s.cfg.RetryAfter, err}
	case errors.Is(err, globalrouter.ErrNoEndpointInSubset):
		e = &httpError{503, "server_error", "no_endpoint_in_subset", "no_endpoint_in_subset", msg, s.cfg.RetryAfter, err}
	case errors.Is(err, globalrouter.ErrNoPool):
		e = &httpError{503, "server_error", "no_pool_available", "no_pool_reachable", msg, s.cfg.RetryAfter, err}
	default:
		return &httpError{500, "server_error", "internal_error", "internal_error", "internal error routing the request", 0, err}
	}
	var r *globalrouter.Refusal
	if errors.As(err, &r) {
		if r.Reason != "" {
			e.reason = r.Reason
		}
		if r.RetryAfter > 0 && e.retryAfter > 0 {
			e.retryAfter = r.RetryAfter
		}
	}
	return e
}

// addressRE matches what names an internal endpoint in an error text: a
// URL, a bracketed IPv6 address, a host:port, a bare IPv4 address.
var addressRE = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"',;)]+|\[[0-9A-Fa-f:.%]+\](:\d+)?|[A-Za-z0-9][A-Za-z0-9.-]*:\d{1,5}\b|\b\d{1,3}(\.\d{1,3}){3}\b`)

// redactAddresses removes internal addresses (workers, local routers,
// etcd) from a message bound for a client: the reasons stay, where they
// point does not. Logs keep the full error.
func redactAddresses(msg string) string {
	return addressRE.ReplaceAllString(msg, "[address]")
}

func bodyHTTPError(e *bodyError) *httpError {
	return &httpError{400, "invalid_request_error", e.reason, e.reason, e.msg, 0, nil}
}

func tooLarge(limit int) *httpError {
	return &httpError{413, "invalid_request_error", "request_too_large", "body_too_large",
		"request body exceeds " + strconv.Itoa(limit) + " bytes", 0, nil}
}

// immediate builds the local reply for e to a request on path: in
// Anthropic's error shape on its Messages path, OpenAI's everywhere else.
func (e *httpError) immediate(path string) *extprocv3.ProcessingResponse {
	var body []byte
	if path == tokenizer.PathMessages {
		body = anthropicError(e.status, e.msg)
	} else {
		body, _ = json.Marshal(map[string]any{"error": map[string]any{
			"message": e.msg, "type": e.errType, "code": e.code,
		}})
	}
	hs := []*corev3.HeaderValueOption{
		setHeader("content-type", "application/json"),
		setHeader(globalrouter.HeaderDropped, e.reason),
	}
	if e.retryAfter > 0 {
		secs := int((e.retryAfter + time.Second - 1) / time.Second)
		hs = append(hs, setHeader("retry-after", strconv.Itoa(secs)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: hs},
			Body:    body,
			Details: "kvgate_" + e.reason,
		},
	}}
}

// anthropicError is Anthropic's error body, {"type": "error", "error":
// {"type": ..., "message": ...}, "request_id": null}, its type chosen by
// status as Anthropic's API documents them (@anthropic-ai/sdk 1.16.0,
// resources/shared.d.ts: ErrorResponse, ErrorType, whose list has no
// request_too_large, so a 413 is an invalid_request_error; 503 has no
// type of its own there and is overloaded_error, what Anthropic answers
// when it cannot take a request).
func anthropicError(status int, msg string) []byte {
	typ := "api_error"
	switch {
	case status == 401:
		typ = "authentication_error"
	case status == 403:
		typ = "permission_error"
	case status == 404:
		typ = "not_found_error"
	case status == 429:
		typ = "rate_limit_error"
	case status == 503 || status == 529:
		typ = "overloaded_error"
	case status == 504:
		typ = "timeout_error"
	case status >= 400 && status < 500:
		typ = "invalid_request_error"
	}
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}, "request_id": nil})
	return b
}

// setHeader overwrites (or adds) a header, value in raw_value as Envoy
// requires. append is left unset, which Envoy reads as overwrite;
// append_action says the same for Envoys that honour it.
func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// withBodyFields returns body (a JSON object) with SGLang's
// routed_dp_rank field set to *rank (when rank is set) and cache_salt (vLLM's and
// SGLang's request field) set to salt (when not ""), a client's own
// values replaced: the tenant's salt already holds the client's
// (globalrouter.Decision.CacheSalt). Every other key's value is kept
// byte for byte; a key the client sent twice is sent once (the last
// value, as Python's json, the engine's parser, reads it).
func withBodyFields(body []byte, rank *uint32, salt string) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, fmt.Errorf("rewrite request body: %w", err)
	}
	if obj == nil {
		return nil, errors.New("rewrite request body: null, want a JSON object")
	}
	if rank != nil {
		obj["routed_dp_rank"] = json.RawMessage(strconv.FormatUint(uint64(*rank), 10))
	}
	if salt != "" {
		v, err := json.Marshal(salt)
		if err != nil {
			return nil, err
		}
		obj["cache_salt"] = v
	}
	return json.Marshal(obj)
}

// destination is the x-gateway-destination-endpoint value: the primary's
// address, then each distinct fallback address in order.
func destination(d *globalrouter.Decision) string {
	if len(d.Fallbacks) == 0 {
		return d.Primary.Address
	}
	seen := map[string]bool{d.Primary.Address: true}
	var sb strings.Builder
	sb.WriteString(d.Primary.Address)
	for _, f := range d.Fallbacks {
		if f.Address == "" || seen[f.Address] {
			continue
		}
		seen[f.Address] = true
		sb.WriteByte(',')
		sb.WriteString(f.Address)
	}
	return sb.String()
}

// routingHeaders are the request header mutations of a decision.
// The trust header never goes upstream (the worker has no use for a
// caller's token), nor the Inference Extension's objective, which the
// endpoint picker strips once it has read it (GIE v1.0.0
// pkg/epp/handlers/request.go).
func routingHeaders(d *globalrouter.Decision, dest string, explain bool, hadPrefiller bool, trustHeader string) *extprocv3.HeaderMutation {
	var hb headerBatch
	hb.grow(6+countTrue(d.Prefill != nil, explain && d.Explanation != ""), len(dest)+len(d.Primary.Pool)+len(d.Primary.WorkerID)+3*digitsReserve)
	hb.set(globalrouter.HeaderDestination, dest)
	hb.set(globalrouter.HeaderPool, d.Primary.Pool)
	hb.set(globalrouter.HeaderWorkerID, d.Primary.WorkerID)
	hb.setUint(globalrouter.HeaderDPRank, uint64(d.Primary.DPRank))
	hb.setUint(globalrouter.HeaderDataParallelRank, uint64(d.Primary.DPRank))
	hb.setInt(globalrouter.HeaderOverlapBlocks, int64(d.Primary.OverlapBlocks))
	m := &extprocv3.HeaderMutation{RemoveHeaders: []string{trustHeader, globalrouter.HeaderObjective}}
	if d.Prefill != nil {
		hb.set(globalrouter.HeaderPrefiller, d.Prefill.Address)
	} else if hadPrefiller {
		// A client must not pick the prefill worker behind the router's back.
		m.RemoveHeaders = append(m.RemoveHeaders, globalrouter.HeaderPrefiller)
	}
	if explain && d.Explanation != "" {
		hb.set(globalrouter.HeaderExplain, headerSafe(d.Explanation))
	}
	m.SetHeaders = hb.out
	return m
}

// responseHeaders are the x-kvgate-* headers added to the response so the
// client sees where its request went: ep, the primary or the fallback the
// data plane reports served it. Only when the Decision says they may go
// to this caller (Decision.Expose), as they reveal what the cache holds.
func responseHeaders(d *globalrouter.Decision, ep globalrouter.Endpoint, explain bool) *extprocv3.HeaderMutation {
	var hb headerBatch
	hb.grow(5+countTrue(d.Prefill != nil, explain && d.Explanation != ""), len(ep.Pool)+len(ep.WorkerID)+len(ep.Address)+2*digitsReserve)
	hb.set(globalrouter.HeaderPool, ep.Pool)
	hb.set(globalrouter.HeaderWorkerID, ep.WorkerID)
	hb.setUint(globalrouter.HeaderDPRank, uint64(ep.DPRank))
	hb.setInt(globalrouter.HeaderOverlapBlocks, int64(ep.OverlapBlocks))
	hb.set(globalrouter.HeaderEndpoint, ep.Address)
	if d.Prefill != nil {
		hb.set(globalrouter.HeaderPrefiller, d.Prefill.Address)
	}
	if explain && d.Explanation != "" {
		hb.set(globalrouter.HeaderExplain, headerSafe(d.Explanation))
	}
	return &extprocv3.HeaderMutation{SetHeaders: hb.out}
}

// headerBatch builds the set headers of one mutation as setHeader does,
// with one allocation for all the options, one for all the values and one
// for all the raw bytes instead of three per header (a routed request's
// six to eight headers were built for every request; BENCHMARKS.md
// "ext_proc exchange CPU"). Each raw value is a full slice expression
// (cap = len), so no value can grow into the next one.
type headerBatch struct {
	opts []corev3.HeaderValueOption
	vals []corev3.HeaderValue
	raw  []byte
	out  []*corev3.HeaderValueOption
}

// digitsReserve is the bytes reserved for a number's value: most ranks
// and overlaps are short (a longer one allocates).
const digitsReserve = 4

func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// grow reserves n headers and about size bytes of values (more headers
// or bytes still work: they allocate).
func (hb *headerBatch) grow(n, size int) {
	hb.opts = make([]corev3.HeaderValueOption, 0, n)
	hb.vals = make([]corev3.HeaderValue, 0, n)
	hb.raw = make([]byte, 0, size)
	hb.out = make([]*corev3.HeaderValueOption, 0, n)
}

func (hb *headerBatch) set(k, v string) {
	start := len(hb.raw)
	hb.raw = append(hb.raw, v...)
	hb.add(k, start)
}

func (hb *headerBatch) setUint(k string, v uint64) {
	start := len(hb.raw)
	hb.raw = strconv.AppendUint(hb.raw, v, 10)
	hb.add(k, start)
}

func (hb *headerBatch) setInt(k string, v int64) {
	start := len(hb.raw)
	hb.raw = strconv.AppendInt(hb.raw, v, 10)
	hb.add(k, start)
}

// add appends the header k whose value is hb.raw[start:].
func (hb *headerBatch) add(k string, start int) {
	if len(hb.opts) == cap(hb.opts) { // pointers into the old arrays stay valid
		hb.opts = make([]corev3.HeaderValueOption, 0, 2*cap(hb.opts)+1)
		hb.vals = make([]corev3.HeaderValue, 0, 2*cap(hb.vals)+1)
	}
	hb.vals = hb.vals[:len(hb.vals)+1]
	val := &hb.vals[len(hb.vals)-1]
	val.Key, val.RawValue = k, hb.raw[start:len(hb.raw):len(hb.raw)]
	hb.opts = hb.opts[:len(hb.opts)+1]
	opt := &hb.opts[len(hb.opts)-1]
	opt.Header, opt.AppendAction = val, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	hb.out = append(hb.out, opt)
}

// asciiFolds spells the non-ASCII symbols explanations use in ASCII.
var asciiFolds = strings.NewReplacer("→", "->", "←", "<-", "µ", "u", "…", "...", "≤", "<=", "≥", ">=", "×", "x", "·", "-")

// headerSafe makes s a valid one-line header value: line breaks become
// "; ", other control characters are dropped, non-ASCII becomes '?', and
// it is clipped.
func headerSafe(s string) string {
	s = asciiFolds.Replace(s)
	var sb strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			sb.WriteString("; ")
		case r == '\t':
			sb.WriteByte(' ')
		case r < 0x20 || r == 0x7f:
		case r > 0x7e:
			sb.WriteByte('?') // keep the value ASCII
		default:
			sb.WriteRune(r)
		}
		if sb.Len() >= maxExplainBytes {
			break
		}
	}
	return strings.TrimSpace(sb.String())
}
