package globalrouter

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/policies"
)

// unreadHeader is a request header the running configuration does not
// read: why says what would read it, logged says its warning was logged
// (once per header per configuration).
type unreadHeader struct {
	name, why string
	count     prometheus.Counter
	logged    atomic.Bool
}

// unreadHeaders lists, once per configuration (build), the request headers
// that only some policies or flow control read and that neither the live
// chain, the shadow chain nor flow control of cfg reads; a decision then
// costs one lookup per entry (none when every header is read). A chain
// with a policy registered from Go (app.WithPolicy) may read any: nothing
// is listed then.
func (r *Router) unreadHeaders(cfg *Config, chain *policies.Chain) []*unreadHeader {
	var read policies.Reads
	var names []string
	for _, c := range []*policies.Chain{chain, cfg.shadowChain} {
		if c == nil {
			continue
		}
		for _, p := range c.Policies() {
			rd, ok := p.(policies.Reader)
			if !ok && !slices.Contains(builtinPolicies, p.Name()) {
				return nil
			}
			if !slices.Contains(names, p.Name()) {
				names = append(names, p.Name())
			}
			if !ok {
				continue
			}
			r := rd.Reads()
			read.Session, read.Priority = read.Session || r.Session, read.Priority || r.Priority
			read.TTFT, read.ITL = read.TTFT || r.TTFT, read.ITL || r.ITL
			read.Headers = append(read.Headers, r.Headers...)
		}
	}
	flow := cfg.FlowControl.Enabled
	chainWords := "the chain (" + strings.Join(names, ", ") + ")"
	off := " flow control is off (flow_control.enabled: false)"
	var out []*unreadHeader
	add := func(name string, isRead bool, why string) {
		if !isRead && !slices.Contains(read.Headers, name) {
			out = append(out, &unreadHeader{name: name, why: why, count: r.m.unreadHeaders.WithLabelValues(name)})
		}
	}
	add(HeaderPriority, read.Priority || flow, fmt.Sprintf("read by the %s policy and flow control only: %s runs no %s policy and%s",
		policies.NamePriority, chainWords, policies.NamePriority, off))
	add(HeaderTTFT, read.TTFT || flow, fmt.Sprintf("read by the %s policy's prefill grid and flow control only: %s has no prefill grid and%s",
		policies.NameSLOGrid, chainWords, off))
	add(HeaderITL, read.ITL, fmt.Sprintf("read by the %s policy's decode grid only: %s has none", policies.NameSLOGrid, chainWords))
	add(HeaderSession, read.Session, fmt.Sprintf("read by the %s policy only, which %s does not run; it is still passed to the pools' local routers, whose worker chain reads it with the session scorer (a router without that scorer logs so once)",
		policies.NameSessionAffinity, chainWords))
	return out
}

// noteUnreadHeaders counts each header of h that st's configuration does
// not read (kvgate_globalrouter_unread_headers_total), logs it once per
// header per configuration, and adds a note to d's explanation when it
// has one (the caller asked, and may see it).
func (r *Router) noteUnreadHeaders(st *state, h map[string]string, d *Decision) {
	if len(h) == 0 {
		return
	}
	for _, u := range st.unread {
		if _, ok := h[u.name]; !ok {
			continue
		}
		u.count.Inc()
		if !u.logged.Swap(true) {
			r.log.Warn("request header not read by this configuration (logged once per header per configuration)", "header", u.name, "why", u.why)
		}
		if d != nil && d.Explanation != "" {
			d.Explanation += "; " + u.name + " not read: " + u.why
		}
	}
}
