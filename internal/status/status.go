// Package status is kvgate's live status page: per pool and worker the
// requests in flight, KV usage, cached blocks, the prefix-cache hit rate
// over the last minutes (an inline SVG chart), the local routers' circuit
// state; the last decisions with their explanation; the configuration and
// its last reload. The page is plain HTML rendered on the server, readable
// with JavaScript off; with JavaScript it reloads its content every second.
// No external assets. The same data is served as JSON.
//
// The page knows nothing of where its numbers come from: a Source
// snapshots them (kvgate up's from its in-process parts, the global
// router's from its pools); a Recorder keeps the last decisions
// (globalrouter.WithObserver(rec.Observe)). Page.Run samples the workers'
// cumulative prefix-cache counters for the chart.
//
// Files: status.go (Page, Snapshot, Source, Recorder, the chart, Handler),
// page.go (the HTML template), router.go (a global router's pools, state
// and configuration as the page shows them).
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
)

// Snapshot is what the page shows at one instant.
type Snapshot struct {
	Title string `json:"title"`
	// Info are header facts (addresses, uptime), in order.
	Info   []Fact     `json:"info"`
	Pools  []Pool     `json:"pools"`
	Config ConfigInfo `json:"config"`
	// Flow are the global router's flow-control queues (RouterFlow).
	Flow []FlowBand `json:"flow,omitempty"`
	// Filled by the Page:
	Time      time.Time  `json:"time"`
	Decisions []Decision `json:"decisions"`
}

// Fact is one labelled value of the page's header.
type Fact struct {
	Label string `json:"label"`
	Value string `json:"value"`
}

// Pool is one pool.
type Pool struct {
	Name string `json:"name"`
	Role string `json:"role"`
	// State is the pool as the global router sees it (PoolState): ok,
	// not probed yet, unreachable, recovering,
	// circuit open, no local router.
	State   string   `json:"state"`
	Routers []Router `json:"routers"`
	// InFlight is the requests the pool's local router tracks (-1:
	// unknown to the Source).
	InFlight    int `json:"in_flight"`
	IndexBlocks int `json:"index_blocks"`
	// Decisions is kvgate_globalrouter_decisions_total{pool,outcome="ok"}.
	Decisions float64  `json:"decisions"`
	Workers   []Worker `json:"workers"`
}

// Router is one local router of a pool and its circuit.
type Router struct {
	Address  string `json:"address"`
	Circuit  string `json:"circuit"` // closed, open, half-open
	Failures int    `json:"failures"`
}

// Worker is one worker of a pool.
type Worker struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	// InFlight is the requests its local router tracks on it.
	InFlight      int     `json:"in_flight"`
	PrefillTokens int     `json:"prefill_tokens"`
	KVUsage       float64 `json:"kv_usage"` // fraction, vllm:kv_cache_usage_perc
	CachedBlocks  int     `json:"cached_blocks"`
	// PrefixQueryTokens and PrefixHitTokens are the engine's cumulative
	// prefix-cache counters (vllm:prefix_cache_queries_total, _hits_total).
	PrefixQueryTokens int64 `json:"prefix_query_tokens"`
	PrefixHitTokens   int64 `json:"prefix_hit_tokens"`
	// Filled by the Page: the hit rate over its history window (-1: no
	// queries in it) and the chart.
	HitRate float64       `json:"hit_rate"`
	History []HitSample   `json:"history"`
	Chart   template.HTML `json:"-"`
}

// HitSample is the hit rate of one sampling interval (-1: no queries).
type HitSample struct {
	Time    time.Time `json:"time"`
	HitRate float64   `json:"hit_rate"`
}

// ConfigInfo is the configuration and its last reload.
type ConfigInfo struct {
	File        string   `json:"file"`
	Chain       []string `json:"chain"`
	ShadowChain []string `json:"shadow_chain,omitempty"`
	Pools       int      `json:"pools"`
	Probe       string   `json:"probe"`
	// FlowControl summarises flow_control ("off" when it is).
	FlowControl string    `json:"flow_control"`
	LastReload  time.Time `json:"last_reload"`
	ReloadError string    `json:"reload_error,omitempty"`
}

// Source snapshots the system. It is called once per page view and per
// sample, concurrently; it must be safe for that and should be fast.
type Source func(ctx context.Context) Snapshot

// Options configure a Page.
type Options struct {
	Source   Source
	Recorder *Recorder // nil: no decisions shown
	// SampleEvery is Run's sampling interval (default 5 s); Window how
	// much history the chart shows (default 5 min).
	SampleEvery time.Duration
	Window      time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Page is the status page. Safe for concurrent use.
type Page struct {
	o Options

	mu      sync.Mutex
	history map[string]*ring // by pool/worker
}

// New returns a page over o.Source.
func New(o Options) *Page {
	if o.SampleEvery <= 0 {
		o.SampleEvery = 5 * time.Second
	}
	if o.Window <= 0 {
		o.Window = 5 * time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Page{o: o, history: map[string]*ring{}}
}

// point is one sample of a worker's cumulative counters.
type point struct {
	t           time.Time
	query, hits int64
}

// ring is a worker's samples, oldest first, at most max.
type ring struct {
	pts []point
	max int
}

func (r *ring) add(p point) {
	if len(r.pts) == r.max {
		copy(r.pts, r.pts[1:])
		r.pts = r.pts[:len(r.pts)-1]
	}
	r.pts = append(r.pts, p)
}

// Sample records every worker's counters once (Run calls it every
// SampleEvery).
func (p *Page) Sample(ctx context.Context) {
	s := p.o.Source(ctx)
	now := p.o.Now()
	max := int(p.o.Window/p.o.SampleEvery) + 1
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	for _, pl := range s.Pools {
		for _, w := range pl.Workers {
			k := pl.Name + "/" + w.ID
			seen[k] = true
			r := p.history[k]
			if r == nil {
				r = &ring{max: max}
				p.history[k] = r
			}
			r.add(point{t: now, query: w.PrefixQueryTokens, hits: w.PrefixHitTokens})
		}
	}
	for k := range p.history {
		if !seen[k] {
			delete(p.history, k) // the worker left
		}
	}
}

// Run samples until ctx ends.
func (p *Page) Run(ctx context.Context) {
	p.Sample(ctx)
	t := time.NewTicker(p.o.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.Sample(ctx)
		}
	}
}

// Snapshot is the source's snapshot completed with the history, the
// charts and the last decisions.
func (p *Page) Snapshot(ctx context.Context) Snapshot {
	s := p.o.Source(ctx)
	s.Time = p.o.Now()
	if p.o.Recorder != nil {
		s.Decisions = p.o.Recorder.Last()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range s.Pools {
		for j := range s.Pools[i].Workers {
			w := &s.Pools[i].Workers[j]
			var pts []point
			if r := p.history[s.Pools[i].Name+"/"+w.ID]; r != nil {
				pts = r.pts
			}
			// The live counters end the window.
			pts = append(append([]point(nil), pts...), point{t: s.Time, query: w.PrefixQueryTokens, hits: w.PrefixHitTokens})
			w.History, w.HitRate = hitRates(pts)
			w.Chart = chart(w.History, p.o.Window, s.Time)
		}
	}
	return s
}

// hitRates turns cumulative samples into per-interval hit rates, and the
// rate over the whole window. A counter that went down (the engine
// restarted) starts afresh.
func hitRates(pts []point) ([]HitSample, float64) {
	var out []HitSample
	var q, h int64
	for i := 1; i < len(pts); i++ {
		dq, dh := pts[i].query-pts[i-1].query, pts[i].hits-pts[i-1].hits
		if dq < 0 || dh < 0 {
			dq, dh = pts[i].query, pts[i].hits
		}
		if pts[i].t.Sub(pts[i-1].t) <= 0 {
			continue
		}
		rate := -1.0
		if dq > 0 {
			rate = float64(dh) / float64(dq)
		}
		q, h = q+dq, h+dh
		out = append(out, HitSample{Time: pts[i].t, HitRate: rate})
	}
	if q == 0 {
		return out, -1
	}
	return out, float64(h) / float64(q)
}

// The chart's size and its plot area: the y axis (0 %..100 %) labelled on
// the left, the time axis (-window..now) below.
const (
	chartW, chartH      = 200.0, 46.0
	plotX0, plotX1      = 30.0, 198.0
	plotTop, plotBottom = 3.0, 35.0
)

// chart draws the hit rate over the window ending at now: 0 % at the
// bottom, 100 % at the top, both labelled, the window's start and now
// under the time axis; intervals without queries leave gaps.
func chart(hs []HitSample, window time.Duration, now time.Time) template.HTML {
	var b strings.Builder
	pw, ph := plotX1-plotX0, plotBottom-plotTop
	fmt.Fprintf(&b, `<svg class="chart" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="prefix hit rate, 0 to 100 %%, over the last %s">`, chartW, chartH, chartW, chartH, window)
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="#f6f8fa" stroke="#d0d7de"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ddd"/>`,
		plotX0, plotTop, pw, ph, plotX0, plotTop+ph/2, plotX1, plotTop+ph/2)
	const label = `<text x="%g" y="%g" font-size="8" fill="#57606a" text-anchor="%s">%s</text>`
	fmt.Fprintf(&b, label, plotX0-2, plotTop+6, "end", "100 %")
	fmt.Fprintf(&b, label, plotX0-2, plotTop+ph/2+3, "end", "50 %")
	fmt.Fprintf(&b, label, plotX0-2, plotBottom, "end", "0 %")
	fmt.Fprintf(&b, label, plotX0, chartH-2, "start", "−"+window.String())
	fmt.Fprintf(&b, label, plotX1, chartH-2, "end", "now")
	var seg []string
	flush := func() {
		if len(seg) == 1 {
			seg = append(seg, seg[0])
		}
		if len(seg) > 0 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f6feb" stroke-width="1.5" points="%s"/>`, strings.Join(seg, " "))
		}
		seg = seg[:0]
	}
	for _, s := range hs {
		if s.HitRate < 0 {
			flush()
			continue
		}
		x := plotX1 - float64(now.Sub(s.Time))/float64(window)*pw
		if x < plotX0 {
			continue
		}
		y := plotBottom - s.HitRate*ph
		seg = append(seg, fmt.Sprintf("%.1f,%.1f", x, y))
	}
	flush()
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// Handler serves the page under prefix (e.g. "/kvgate/status"): prefix/
// the HTML page, prefix/fragment its live part (what the page's script
// reloads every second), prefix/status.json the snapshot as JSON.
func (p *Page) Handler(prefix string) http.Handler {
	prefix = strings.TrimSuffix(prefix, "/")
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+prefix+"/{$}", func(w http.ResponseWriter, r *http.Request) {
		p.render(w, r, "page")
	})
	mux.HandleFunc("GET "+prefix+"/fragment", func(w http.ResponseWriter, r *http.Request) {
		p.render(w, r, "live")
	})
	mux.HandleFunc("GET "+prefix+"/status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		w.Header().Set("cache-control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(p.Snapshot(r.Context()))
	})
	mux.HandleFunc(prefix, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, prefix+"/", http.StatusMovedPermanently)
	})
	return mux
}

func (p *Page) render(w http.ResponseWriter, r *http.Request, name string) {
	w.Header().Set("content-type", "text/html; charset=utf-8")
	w.Header().Set("cache-control", "no-store")
	if err := pageTemplate.ExecuteTemplate(w, name, p.Snapshot(r.Context())); err != nil {
		// Headers are gone; the page ends where the error struck.
		fmt.Fprintf(w, "<p>render error: %s</p>", template.HTMLEscapeString(err.Error()))
	}
}

// Decision is one decision on the page.
type Decision struct {
	Time        time.Time `json:"time"`
	RequestID   string    `json:"request_id"`
	Model       string    `json:"model"`
	Outcome     string    `json:"outcome"`
	Pool        string    `json:"pool,omitempty"`
	Worker      string    `json:"worker,omitempty"`
	Overlap     int       `json:"overlap_blocks"`
	Blocks      int       `json:"request_blocks"`
	Micros      int64     `json:"duration_us"`
	Explanation string    `json:"explanation"`
}

// Recorder keeps the last decisions. Safe for concurrent use; Observe
// takes a lock for a copy, never blocks on I/O.
type Recorder struct {
	mu   sync.Mutex
	buf  []Decision
	next int
	full bool
}

// NewRecorder keeps the last n decisions (default 20 when n <= 0).
func NewRecorder(n int) *Recorder {
	if n <= 0 {
		n = 20
	}
	return &Recorder{buf: make([]Decision, n)}
}

// Observe records a decision (globalrouter.WithObserver(rec.Observe)).
func (r *Recorder) Observe(o globalrouter.Observation) {
	d := Decision{Time: o.Time, RequestID: o.RequestID, Model: o.Model, Outcome: o.Outcome, Micros: o.Duration.Microseconds()}
	if o.Decision != nil {
		d.Pool, d.Worker, d.Overlap, d.Blocks, d.Explanation = o.Decision.Primary.Pool, o.Decision.Primary.WorkerID, o.Decision.Primary.OverlapBlocks, o.Decision.RequestBlocks, o.Explanation
		if d.Explanation == "" {
			d.Explanation = o.Decision.Explanation
		}
	} else if o.Err != nil {
		d.Explanation = o.Err.Error()
	}
	r.mu.Lock()
	r.buf[r.next] = d
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
	r.mu.Unlock()
}

// Last returns the recorded decisions, newest first.
func (r *Recorder) Last() []Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.next
	if r.full {
		n = len(r.buf)
	}
	out := make([]Decision, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}
