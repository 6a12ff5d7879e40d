// Package xfcc parses Envoy's x-forwarded-client-cert (XFCC) request
// header, as Envoy's HTTP connection manager writes it
// (envoyproxy/envoy docs/root/configuration/http/http_conn_man/headers.rst
// §x-forwarded-client-cert, fb39ca75139560daf6d8f5240abaa3a602a508b0;
// written by source/common/http/conn_manager_utility.cc,
// mutateXfccRequestHeader):
//
//   - the value is a comma-separated list of elements, one per proxy that
//     appended one (AppendForward), the last one the current proxy's;
//   - an element is a semicolon-separated list of key=value pairs; keys
//     are case-insensitive (By, Hash, Cert, Chain, Subject, URI, DNS),
//     values case-sensitive;
//   - a value holding ',', ';' or '=' is double-quoted, and a double quote
//     inside it is written \" (Subject, Cert and Chain are always quoted);
//   - By, URI and DNS repeat, once per SAN.
//
// Parse reads a header into Elements and refuses what Envoy never writes
// (an unterminated quote, text after a closing quote, a pair without '=',
// a single-valued key twice in one element), naming the element, the pair
// and the byte offset. Unknown keys are skipped: a newer Envoy may add
// some. xfcc.go holds the parser; xfcc_test.go its tests and fuzz test.
package xfcc

import (
	"errors"
	"fmt"
	"strings"
)

// Element is one proxy's entry: the client certificate it saw.
type Element struct {
	// By are the URI SANs of the proxy's own certificate.
	By []string
	// Hash is the SHA-256 of the client certificate (hex).
	Hash string
	// Cert and Chain are the URL-encoded PEM certificate and chain.
	Cert, Chain string
	// Subject is the certificate's subject (its key is always written,
	// even when empty).
	Subject string
	// URI and DNS are the client certificate's URI and DNS SANs.
	URI, DNS []string
}

// ErrSyntax is wrapped by every error of Parse.
var ErrSyntax = errors.New("x-forwarded-client-cert")

// MaxElements bounds the elements one header may hold: no chain of proxies
// is that long, and it bounds the work a forged header can cause.
const MaxElements = 64

// Parse reads an XFCC header value. An empty value has no elements.
func Parse(v string) ([]Element, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []Element
	p := parser{s: v}
	for {
		if len(out) == MaxElements {
			return nil, p.errf("more than %d elements", MaxElements)
		}
		e, err := p.element(len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, e)
		if p.i == len(p.s) {
			return out, nil
		}
		p.i++ // the ','
	}
}

type parser struct {
	s string
	i int
}

func (p *parser) errf(format string, a ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrSyntax, p.i, fmt.Sprintf(format, a...))
}

// element reads pairs up to the next ',' outside quotes or the end.
func (p *parser) element(n int) (Element, error) {
	var e Element
	seen := map[string]bool{}
	for pair := 0; ; pair++ {
		key, val, err := p.pair()
		if err != nil {
			return e, fmt.Errorf("element %d, pair %d: %w", n, pair, err)
		}
		k := strings.ToLower(key)
		single := k == "hash" || k == "cert" || k == "chain" || k == "subject"
		if single && seen[k] {
			return e, fmt.Errorf("element %d, pair %d: %w", n, pair, p.errf("key %q twice in one element", key))
		}
		seen[k] = true
		switch k {
		case "by":
			e.By = append(e.By, val)
		case "hash":
			e.Hash = val
		case "cert":
			e.Cert = val
		case "chain":
			e.Chain = val
		case "subject":
			e.Subject = val
		case "uri":
			e.URI = append(e.URI, val)
		case "dns":
			e.DNS = append(e.DNS, val)
		}
		if p.i == len(p.s) || p.s[p.i] == ',' {
			return e, nil
		}
		p.i++ // the ';'
	}
}

// pair reads key=value, leaving p.i at the ',' or ';' after it or at the
// end.
func (p *parser) pair() (key, val string, err error) {
	start := p.i
	for p.i < len(p.s) && p.s[p.i] != '=' && p.s[p.i] != ';' && p.s[p.i] != ',' {
		p.i++
	}
	key = strings.TrimSpace(p.s[start:p.i])
	if p.i == len(p.s) || p.s[p.i] != '=' {
		return "", "", p.errf("want key=value, got %q", clip(p.s[start:p.i]))
	}
	if key == "" || strings.ContainsAny(key, "\"\\") {
		return "", "", p.errf("bad key %q", clip(key))
	}
	p.i++ // the '='
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
	if p.i < len(p.s) && p.s[p.i] == '"' {
		val, err = p.quoted()
		if err != nil {
			return "", "", err
		}
		for p.i < len(p.s) && p.s[p.i] == ' ' {
			p.i++
		}
		if p.i < len(p.s) && p.s[p.i] != ';' && p.s[p.i] != ',' {
			return "", "", p.errf("text after the closing quote of %s", key)
		}
		return key, val, nil
	}
	start = p.i
	for p.i < len(p.s) && p.s[p.i] != ';' && p.s[p.i] != ',' {
		if p.s[p.i] == '"' {
			return "", "", p.errf("a quote inside the unquoted value of %s", key)
		}
		p.i++
	}
	return key, strings.TrimSpace(p.s[start:p.i]), nil
}

// quoted reads a double-quoted value from its opening quote, unescaping \".
func (p *parser) quoted() (string, error) {
	open := p.i
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\\' && p.i+1 < len(p.s) && p.s[p.i+1] == '"':
			b.WriteByte('"')
			p.i += 2
		case c == '"':
			p.i++
			return b.String(), nil
		default:
			b.WriteByte(c)
			p.i++
		}
	}
	p.i = open
	return "", p.errf("unterminated quoted value")
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
