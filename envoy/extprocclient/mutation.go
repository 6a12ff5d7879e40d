package extprocclient

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// checkResult is mutation_rules.cc's CheckResult.
type checkResult int

const (
	checkOK checkResult = iota
	checkIgnore
	checkFail
)

type checkOp int

const (
	opSet checkOp = iota
	opAppend
	opRemove
)

// checker reproduces Envoy's mutation_rules Checker.
type checker struct {
	rules    *mutationrulesv3.HeaderMutationRules
	allow    *regexp.Regexp
	disallow *regexp.Regexp
}

func newChecker(rules *mutationrulesv3.HeaderMutationRules) (*checker, error) {
	c := &checker{rules: rules}
	var err error
	if re := rules.GetAllowExpression().GetRegex(); re != "" {
		if c.allow, err = regexp.Compile(re); err != nil {
			return nil, fmt.Errorf("mutation_rules.allow_expression: %w", err)
		}
	}
	if re := rules.GetDisallowExpression().GetRegex(); re != "" {
		if c.disallow, err = regexp.Compile(re); err != nil {
			return nil, fmt.Errorf("mutation_rules.disallow_expression: %w", err)
		}
	}
	return c, nil
}

func (c *checker) ignoreOrFail() checkResult {
	if c.rules.GetDisallowIsError().GetValue() {
		return checkFail
	}
	return checkIgnore
}

func fullMatch(re *regexp.Regexp, s string) bool {
	loc := re.FindStringIndex(s)
	return loc != nil && loc[0] == 0 && loc[1] == len(s)
}

func (c *checker) check(op checkOp, name, value string) checkResult {
	if !validHeaderName(name) || (op != opRemove && !validHeaderValue(value)) {
		return checkFail
	}
	system := strings.HasPrefix(name, ":") || name == "host"
	if op == opRemove && system {
		// Neither pseudo-headers nor host can ever be removed.
		return c.ignoreOrFail()
	}
	if op == opAppend && strings.HasPrefix(name, ":") {
		return c.ignoreOrFail()
	}
	if c.rules.GetDisallowAll().GetValue() {
		return c.ignoreOrFail()
	}
	if system && c.rules.GetDisallowSystem().GetValue() {
		return c.ignoreOrFail()
	}
	if c.disallow != nil && fullMatch(c.disallow, name) {
		return c.ignoreOrFail()
	}
	if c.allow != nil && fullMatch(c.allow, name) {
		return checkOK
	}
	switch {
	case name == "host" || name == ":authority" || name == ":method" || name == ":scheme":
		if !c.rules.GetAllowAllRouting().GetValue() {
			return c.ignoreOrFail()
		}
	case strings.HasPrefix(name, "x-envoy-"):
		if !c.rules.GetAllowEnvoy().GetValue() {
			return c.ignoreOrFail()
		}
	}
	return checkOK
}

// validHeaderName accepts an RFC 9110 token, optionally behind one ':'.
func validHeaderName(s string) bool {
	s = strings.TrimPrefix(s, ":")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue refuses NUL, CR and LF, as Envoy's headerValueIsValid does.
func validHeaderValue(s string) bool {
	return !strings.ContainsAny(s, "\x00\r\n")
}

// errMutation marks a header mutation Envoy answers with status_on_error.
var errMutation = errors.New("header mutation rejected")

// mutateOptions carries the context of one mutation.
type mutateOptions struct {
	// skipContentLength drops a server's content-length (modes in which
	// Envoy removes it).
	skipContentLength bool
	// replacing permits :method (CONTINUE_AND_REPLACE).
	replacing bool
}

// applyHeaderMutation applies m to h with Envoy's rules (mutation_utils.cc):
// only the legacy append BoolValue counts (unset = overwrite), values come
// from raw_value, refused mutations are ignored and counted unless
// disallow_is_error. It returns the number of ignored mutations.
func (c *checker) applyHeaderMutation(h *Headers, m *extprocv3.HeaderMutation, o mutateOptions) (int, error) {
	if m == nil {
		return 0, nil
	}
	rejected := 0
	for _, name := range m.GetRemoveHeaders() {
		name = strings.ToLower(name)
		if o.skipContentLength && name == "content-length" {
			continue
		}
		switch c.check(opRemove, name, "") {
		case checkIgnore:
			rejected++
			continue
		case checkFail:
			return rejected, fmt.Errorf("%w: invalid attempt to remove %s", errMutation, name)
		}
		h.Del(name)
	}
	for _, o2 := range m.GetSetHeaders() {
		hv := o2.GetHeader()
		if hv == nil {
			continue
		}
		name := strings.ToLower(hv.GetKey())
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return rejected, fmt.Errorf("%w: header %s has both value and raw_value", errMutation, name)
		}
		// Envoy reads raw_value only: value alone yields an empty header.
		value := string(hv.GetRawValue())
		if o.skipContentLength && name == "content-length" {
			continue
		}
		//lint:ignore SA1019 Envoy honours only the deprecated append (mutation_utils.cc), not append_action.
		appendValue := o2.GetAppend().GetValue()
		_, exists := h.Get(name)
		op := opSet
		if appendValue && exists {
			op = opAppend
		}
		res := c.check(op, name, value)
		if o.replacing && name == ":method" && res != checkFail {
			res = checkOK
		}
		switch res {
		case checkIgnore:
			rejected++
			continue
		case checkFail:
			return rejected, fmt.Errorf("%w: invalid attempt to modify %s", errMutation, name)
		}
		if name == ":status" {
			if code, err := strconv.Atoi(value); err != nil || code < 200 || code > 999 {
				return rejected, fmt.Errorf("%w: invalid :status %q", errMutation, value)
			}
		}
		if appendValue {
			h.Add(name, value)
		} else {
			h.Set(name, value)
		}
	}
	if len(*h) > maxHeadersCount || h.size() > maxHeadersBytes {
		return rejected, fmt.Errorf("%w: header map over the connection manager's limits", errMutation)
	}
	return rejected, nil
}
