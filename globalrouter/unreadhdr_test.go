package globalrouter_test

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestUnreadHeaders: a request header the running configuration does not
// read is named in the explanation, counted by header, and logged once per
// header per configuration; once a reload makes something read it (flow
// control: priority and TTFT; session-affinity: the session), it is not.
func TestUnreadHeaders(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	both := map[string]string{"pool-a": c.a.Addr, "pool-b": c.b.Addr}
	dir := write(t, map[string]string{"pools.yaml": configText(both, "[model-match, cost]")})
	path := filepath.Join(dir, "pools.yaml")
	cfg, err := globalrouter.LoadConfig(path, builtins(t))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	r, reg := newRouter(t, *cfg, globalrouter.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	hdrs := map[string]string{globalrouter.HeaderPriority: "3", globalrouter.HeaderTTFT: "200",
		globalrouter.HeaderITL: "20", globalrouter.HeaderSession: "s1"}
	decide := func() string {
		t.Helper()
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Explain: true, Headers: hdrs})
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		free(t, d)
		return d.Explanation
	}
	all := []string{globalrouter.HeaderPriority, globalrouter.HeaderTTFT, globalrouter.HeaderITL, globalrouter.HeaderSession}
	for range 2 {
		ex := decide()
		for _, h := range all {
			if !strings.Contains(ex, "; "+h+" not read: read by ") {
				t.Errorf("explanation %q names no unread %s", ex, h)
			}
		}
	}
	for _, h := range all {
		if got := countByLabel(t, reg, "kvgate_globalrouter_unread_headers_total", "header", h); got != 2 {
			t.Errorf("unread %s counted %v, want 2", h, got)
		}
		if n := strings.Count(logs.String(), "header="+h); n != 1 {
			t.Errorf("%s logged %d times over two requests, want once:\n%s", h, n, logs.String())
		}
	}
	if ex := decide(); !strings.Contains(ex, "the chain (model-match, cost) runs no priority policy") {
		t.Errorf("explanation %q does not say what the chain runs", ex)
	}

	// Flow control reads priority and TTFT, session-affinity the
	// session: only the ITL target is left unread.
	text := "trust: {steering: on, routing_headers: on}\nflow_control: {enabled: true}\n" + configText(both, "[model-match, cost, session-affinity]")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.ReloadFile(path); err != nil {
		t.Fatalf("ReloadFile: %v", err)
	}
	ex := decide()
	for _, h := range all {
		if want := h == globalrouter.HeaderITL; strings.Contains(ex, h+" not read") != want {
			t.Errorf("after the reload: explanation %q: %s noted %v, want %v", ex, h, !want, want)
		}
	}
	if got := countByLabel(t, reg, "kvgate_globalrouter_unread_headers_total", "header", globalrouter.HeaderPriority); got != 3 {
		t.Errorf("priority counted %v after the reload, want still 3", got)
	}
	if n := strings.Count(logs.String(), "header="+globalrouter.HeaderITL); n != 2 {
		t.Errorf("ITL logged %d times over two configurations, want twice", n)
	}

	// A header-match rule naming the ITL header reads it.
	flowOnly := text
	text = strings.Replace(text, "routers: {static: [\""+c.a.Addr+"\"]}",
		"routers: {static: [\""+c.a.Addr+"\"]}\n    policy: {header-match: {headers: {x-kvgate-itl-ms: []}}}", 1)
	text = strings.Replace(text, "[model-match, cost, session-affinity]", "[model-match, header-match, cost, session-affinity]", 1)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.ReloadFile(path); err != nil {
		t.Fatalf("ReloadFile: %v", err)
	}
	if ex := decide(); strings.Contains(ex, " not read: ") {
		t.Errorf("with header-match on %s: explanation %q notes a header", globalrouter.HeaderITL, ex)
	}
	if got := countByLabel(t, reg, "kvgate_globalrouter_unread_headers_total", "header", globalrouter.HeaderITL); got != 4 {
		t.Errorf("ITL counted %v once header-match reads it, want still 4", got)
	}
	if err := os.WriteFile(path, []byte(flowOnly), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.ReloadFile(path); err != nil {
		t.Fatalf("ReloadFile: %v", err)
	}

	// Without an explanation asked for, nothing is added; still counted.
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Headers: hdrs})
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	if d.Explanation != "" {
		t.Errorf("explanation %q without x-kvgate-explain", d.Explanation)
	}
	if got := countByLabel(t, reg, "kvgate_globalrouter_unread_headers_total", "header", globalrouter.HeaderITL); got != 5 {
		t.Errorf("ITL counted %v, want 5", got)
	}
}

// TestUnreadHeadersPinnedAndSubtree: a request pinned to a worker gets
// the notes too, the session's saying that no local router's worker chain
// reads it (none chooses a pinned worker); in subtree mode a parent's
// session key (the prompt's) that the subtree's chain does not read is
// counted as the header would be; and the configuration lists what it
// does not read (what kvgate policy check prints).
func TestUnreadHeadersPinnedAndSubtree(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, reg := newRouter(t, c.cfg) // the default chain: no priority, no session-affinity
	hdrs := map[string]string{globalrouter.HeaderPriority: "3", globalrouter.HeaderSession: "s1", globalrouter.HeaderWorkerID: "a-0"}
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Explain: true, Headers: hdrs})
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	for _, want := range []string{
		"; " + globalrouter.HeaderPriority + " not read: read by the priority policy and flow control only",
		"; " + globalrouter.HeaderSession + " not read: read by the session-affinity policy only, which the chain (model-match, disaggregate, cost) does not run; nor does a local router's worker chain, which does not choose a worker the request is pinned to (x-kvgate-worker-id)",
	} {
		if !strings.Contains(d.Explanation, want) {
			t.Errorf("pinned request's explanation %q lacks %q", d.Explanation, want)
		}
	}
	if got := countByLabel(t, reg, "kvgate_globalrouter_unread_headers_total", "header", globalrouter.HeaderSession); got != 1 {
		t.Errorf("pinned request: session counted %v, want 1", got)
	}

	p := prompt(t, chatTokens(t, chat(longText(40))))
	if _, err := r.Subtree().Probe(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.SessionKey = "s2"
	if _, err := r.Subtree().Probe(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := countByLabel(t, reg, "kvgate_globalrouter_unread_headers_total", "header", globalrouter.HeaderSession); got != 2 {
		t.Errorf("after a subtree probe with a session key and one without: session counted %v, want 2", got)
	}

	list, err := c.cfg.UnreadHeaders(nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range list {
		names = append(names, u.Name)
	}
	if got, want := strings.Join(names, " "), "x-kvgate-priority x-kvgate-ttft-ms x-kvgate-itl-ms x-kvgate-session-id"; got != want {
		t.Errorf("UnreadHeaders: got %s, want %s", got, want)
	}
}
