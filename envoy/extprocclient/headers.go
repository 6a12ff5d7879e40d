package extprocclient

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// HeaderField is one header line as Envoy's header map holds it: a
// lower-case key and a value.
type HeaderField struct {
	Key   string
	Value string
}

// Headers is an ordered header map as Envoy keeps it: lower-case keys,
// pseudo-headers (":method", ":path", ":authority", ":scheme", ":status")
// included, a key may repeat. The zero value is an empty map.
type Headers []HeaderField

// Get returns the first value of key (compared case-insensitively) and
// whether it is present.
func (h Headers) Get(key string) (string, bool) {
	key = strings.ToLower(key)
	for _, f := range h {
		if f.Key == key {
			return f.Value, true
		}
	}
	return "", false
}

// Values returns every value of key, in order.
func (h Headers) Values(key string) []string {
	key = strings.ToLower(key)
	var out []string
	for _, f := range h {
		if f.Key == key {
			out = append(out, f.Value)
		}
	}
	return out
}

// Set replaces every value of key with value: the first occurrence keeps its
// position, later ones are dropped; a new key goes at the end.
func (h *Headers) Set(key, value string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	done := false
	for _, f := range *h {
		if f.Key != key {
			out = append(out, f)
			continue
		}
		if !done {
			out = append(out, HeaderField{key, value})
			done = true
		}
	}
	if !done {
		out = append(out, HeaderField{key, value})
	}
	*h = out
}

// Add appends another value of key.
func (h *Headers) Add(key, value string) {
	*h = append(*h, HeaderField{strings.ToLower(key), value})
}

// Del removes every value of key.
func (h *Headers) Del(key string) {
	key = strings.ToLower(key)
	out := (*h)[:0]
	for _, f := range *h {
		if f.Key != key {
			out = append(out, f)
		}
	}
	*h = out
}

// Clone returns a copy that shares nothing with h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	return append(Headers(nil), h...)
}

// size is the header map's byte size as Envoy counts it against
// max_request_headers_kb: keys plus values.
func (h Headers) size() int {
	n := 0
	for _, f := range h {
		n += len(f.Key) + len(f.Value)
	}
	return n
}

// toProto renders h as Envoy sends it: every value in raw_value, value empty.
func (h Headers) toProto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(h))}
	for _, f := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: f.Key, RawValue: []byte(f.Value)})
	}
	return m
}
