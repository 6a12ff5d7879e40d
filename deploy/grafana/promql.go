// Package grafana holds kvgate's Grafana dashboard (kvgate.json) and the
// reader its test checks the panels' queries with: MetricSelectors lists
// the metrics a PromQL expression selects, refusing what it cannot read,
// so that a dashboard query naming a metric no kvgate server exposes
// fails the test instead of drawing an empty panel.
package grafana

import (
	"fmt"
	"strings"
)

// Selector is one metric a query selects, with the labels its matchers
// name.
type Selector struct {
	Metric string
	Labels []string
}

// functions are the PromQL functions and aggregations the reader knows:
// an identifier followed by "(" must be one of them.
var functions = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "quantile": true, "count_values": true, "group": true,
	"rate": true, "irate": true, "increase": true, "delta": true, "idelta": true, "deriv": true,
	"histogram_quantile": true, "histogram_fraction": true, "abs": true, "ceil": true, "floor": true, "round": true,
	"clamp": true, "clamp_min": true, "clamp_max": true, "sort": true, "sort_desc": true, "label_replace": true,
	"avg_over_time": true, "max_over_time": true, "min_over_time": true, "sum_over_time": true, "last_over_time": true,
	"absent": true, "vector": true, "scalar": true, "time": true,
}

// grouping keywords take a parenthesised list of label names.
var grouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

var operators = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true}

// MetricSelectors returns the metrics expr selects. It reads the PromQL a
// dashboard uses: selectors with matchers, ranges ([5m],
// [$__rate_interval]), functions, aggregations with by/without, binary
// operators and numbers; anything else (an unknown function, a selector
// by __name__, a Grafana variable outside a range) is an error.
func MetricSelectors(expr string) ([]Selector, error) {
	var out []Selector
	i := 0
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipSpace := func() {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n' || expr[i] == '\r') {
			i++
		}
	}
	ident := func() string {
		j := i
		for i < len(expr) && isIdent(expr[i]) {
			i++
		}
		return expr[j:i]
	}
	str := func() error {
		q := expr[i]
		i++
		for i < len(expr) && expr[i] != q {
			if expr[i] == '\\' && q != '`' {
				i++
			}
			i++
		}
		if i >= len(expr) {
			return fmt.Errorf("unterminated string at %d", i)
		}
		i++
		return nil
	}
	// matchers reads {l="v", ...} at i and returns the label names.
	matchers := func() ([]string, error) {
		i++ // {
		var labels []string
		for {
			skipSpace()
			if i < len(expr) && expr[i] == '}' {
				i++
				return labels, nil
			}
			if i >= len(expr) || !isIdentStart(expr[i]) {
				return nil, fmt.Errorf("label name expected at %d", i)
			}
			labels = append(labels, ident())
			skipSpace()
			switch {
			case strings.HasPrefix(expr[i:], "=~"), strings.HasPrefix(expr[i:], "!~"), strings.HasPrefix(expr[i:], "!="):
				i += 2
			case strings.HasPrefix(expr[i:], "="):
				i++
			default:
				return nil, fmt.Errorf("matcher operator expected at %d", i)
			}
			skipSpace()
			if i >= len(expr) || (expr[i] != '"' && expr[i] != '\'' && expr[i] != '`') {
				return nil, fmt.Errorf("quoted label value expected at %d", i)
			}
			if err := str(); err != nil {
				return nil, err
			}
			skipSpace()
			if i < len(expr) && expr[i] == ',' {
				i++
			}
		}
	}
	for {
		skipSpace()
		if i >= len(expr) {
			return out, nil
		}
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			if err := str(); err != nil {
				return nil, err
			}
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated range at %d", i)
			}
			r := expr[i+1 : i+j]
			if r != "$__rate_interval" && r != "$__interval" && strings.Trim(r, "0123456789smhdwy:") != "" {
				return nil, fmt.Errorf("range [%s] at %d: want a duration or $__rate_interval", r, i)
			}
			i += j + 1
		case c == '{':
			return nil, fmt.Errorf("a selector without a metric name at %d", i)
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (expr[i] >= '0' && expr[i] <= '9' || expr[i] == '.' || expr[i] == 'e') {
				i++
			}
		case isIdentStart(c):
			name := ident()
			skipSpace()
			next := byte(0)
			if i < len(expr) {
				next = expr[i]
			}
			switch {
			case grouping[name]:
				if next != '(' {
					return nil, fmt.Errorf("%s without a label list at %d", name, i)
				}
				j := strings.IndexByte(expr[i:], ')')
				if j < 0 {
					return nil, fmt.Errorf("unterminated %s list at %d", name, i)
				}
				for _, l := range strings.Split(expr[i+1:i+j], ",") {
					if l = strings.TrimSpace(l); l != "" && strings.TrimFunc(l, func(r rune) bool { return r < 128 && isIdent(byte(r)) }) != "" {
						return nil, fmt.Errorf("%s: bad label %q", name, l)
					}
				}
				i += j + 1
			case operators[name]:
			case functions[name] && (strings.HasPrefix(expr[i:], "by") || strings.HasPrefix(expr[i:], "without")):
				// an aggregation whose grouping comes first: sum by (l) (...)
			case next == '(':
				if !functions[name] {
					return nil, fmt.Errorf("unknown function %q", name)
				}
			default:
				sel := Selector{Metric: name}
				if next == '{' {
					labels, err := matchers()
					if err != nil {
						return nil, fmt.Errorf("%s: %w", name, err)
					}
					sel.Labels = labels
				}
				out = append(out, sel)
			}
		case c == '$':
			return nil, fmt.Errorf("a Grafana variable outside a range at %d", i)
		case strings.IndexByte("()+-*/%^=!<>,", c) >= 0:
			i++
		default:
			return nil, fmt.Errorf("unexpected %q at %d", c, i)
		}
	}
}
