package globalrouter

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/policies"
)

// UnreadHeader is a request header a configuration does not read: Why
// says what would read it. PinnedWhy, when set, replaces Why for a request
// pinned to a worker (x-kvgate-worker-id), which some readers never see.
type UnreadHeader struct {
	Name, Why, PinnedWhy string
}

// UnreadHeaders lists the request headers that only some policies or flow
// control read (x-kvgate-priority, -ttft-ms, -itl-ms, -session-id) and
// that neither the live chain (built with reg; nil: the built-in
// policies), the shadow chain nor flow control of c reads; the Router
// lists them once per configuration and notes each request that carries
// one (kvgate policy check prints them). A chain with a policy registered
// from Go (app.WithPolicy) may read any: nothing is listed then.
func (c *Config) UnreadHeaders(reg *policies.Registry) ([]UnreadHeader, error) {
	chain, err := c.buildChain(builtins(reg))
	if err != nil {
		return nil, err
	}
	return c.unreadHeaders(chain), nil
}

// unreadHeaders is UnreadHeaders with the live chain built.
func (c *Config) unreadHeaders(chain *policies.Chain) []UnreadHeader {
	var read policies.Reads
	var names []string
	for _, ch := range []*policies.Chain{chain, c.shadowChain} {
		if ch == nil {
			continue
		}
		for _, p := range ch.Policies() {
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
	flow := c.FlowControl.Enabled
	chainWords := "the chain (" + strings.Join(names, ", ") + ")"
	off := " flow control is off (flow_control.enabled: false)"
	var out []UnreadHeader
	add := func(name string, isRead bool, why string) *UnreadHeader {
		if isRead || slices.Contains(read.Headers, name) {
			return nil
		}
		out = append(out, UnreadHeader{Name: name, Why: why})
		return &out[len(out)-1]
	}
	add(HeaderPriority, read.Priority || flow, fmt.Sprintf("read by the %s policy and flow control only: %s runs no %s policy and%s",
		policies.NamePriority, chainWords, policies.NamePriority, off))
	add(HeaderTTFT, read.TTFT || flow, fmt.Sprintf("read by the %s policy's prefill grid and flow control only: %s has no prefill grid and%s",
		policies.NameSLOGrid, chainWords, off))
	add(HeaderITL, read.ITL, fmt.Sprintf("read by the %s policy's decode grid only: %s has none", policies.NameSLOGrid, chainWords))
	only := fmt.Sprintf("read by the %s policy only, which %s does not run", policies.NameSessionAffinity, chainWords)
	if u := add(HeaderSession, read.Session, only+"; it is still passed to the pools' local routers, whose worker chain reads it with the session scorer (a router without that scorer logs so once)"); u != nil {
		u.PinnedWhy = only + "; nor does a local router's worker chain, which does not choose a worker the request is pinned to (" + HeaderWorkerID + ")"
	}
	return out
}

// unreadHeader is an UnreadHeader of the running configuration, counted
// and logged (once per header per configuration).
type unreadHeader struct {
	UnreadHeader
	count  prometheus.Counter
	logged atomic.Bool
}

// unreadHeaders lists cfg's unread headers for the Router (build): a
// decision then costs one lookup per entry (none when every header is
// read).
func (r *Router) unreadHeaders(cfg *Config, chain *policies.Chain) []*unreadHeader {
	var out []*unreadHeader
	for _, u := range cfg.unreadHeaders(chain) {
		out = append(out, &unreadHeader{UnreadHeader: u, count: r.m.unreadHeaders.WithLabelValues(u.Name)})
	}
	return out
}

// noteUnreadHeaders counts each header of h that st's configuration does
// not read (kvgate_globalrouter_unread_headers_total), logs it once per
// header per configuration, and adds a note to d's explanation when it
// has one (the caller asked, and may see it); pinned: the request is
// pinned to a worker.
func (r *Router) noteUnreadHeaders(st *state, h map[string]string, pinned bool, d *Decision) {
	if len(h) == 0 {
		return
	}
	for _, u := range st.unread {
		if _, ok := h[u.Name]; ok {
			r.noteUnread(u, pinned, d)
		}
	}
}

// noteUnreadSession is noteUnreadHeaders for a subtree's probe or commit
// (subtree.go): the parent's session key arrives as the prompt's, and no
// explanation goes back.
func (r *Router) noteUnreadSession(st *state, key string) {
	if key == "" {
		return
	}
	for _, u := range st.unread {
		if u.Name == HeaderSession {
			r.noteUnread(u, false, nil)
		}
	}
}

func (r *Router) noteUnread(u *unreadHeader, pinned bool, d *Decision) {
	why := u.Why
	if pinned && u.PinnedWhy != "" {
		why = u.PinnedWhy
	}
	u.count.Inc()
	if !u.logged.Swap(true) {
		r.log.Warn("request header not read by this configuration (logged once per header per configuration)", "header", u.Name, "why", why)
	}
	if d != nil && d.Explanation != "" {
		d.Explanation += "; " + u.Name + " not read: " + why
	}
}
