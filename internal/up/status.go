package up

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/status"
	"github.com/kvgate/kvgate/localrouter"
)

// Status is the status page's data, also served as JSON.
type Status struct {
	Uptime  string       `json:"uptime"`
	Gateway string       `json:"gateway"`
	Extproc string       `json:"extproc"`
	Etcd    []string     `json:"etcd"`
	NATS    string       `json:"nats"`
	Model   string       `json:"model"`
	Pools   []PoolStatus `json:"pools"`
}

// PoolStatus is one pool on the status page.
type PoolStatus struct {
	Name            string         `json:"name"`
	Role            string         `json:"role"`
	Router          string         `json:"router"`
	RouterState     string         `json:"router_state"` // as the global router sees it
	RoutersKnown    int            `json:"routers_known"`
	RoutersUp       int            `json:"routers_available"`
	RequestsActive  int            `json:"requests_active"`
	IndexBlocks     int            `json:"index_blocks"`
	Workers         []WorkerStatus `json:"workers"`
	RouterIsStopped bool           `json:"router_stopped"`
}

// WorkerStatus is one worker on the status page.
type WorkerStatus struct {
	ID             string  `json:"id"`
	Address        string  `json:"address"`
	ActiveRequests int     `json:"active_requests"`
	PrefillTokens  int     `json:"prefill_tokens"`
	ActiveBlocks   int     `json:"active_blocks"`
	Running        int     `json:"running"`
	Waiting        int     `json:"waiting"`
	KVUsage        float64 `json:"kv_usage"`
	CachedBlocks   int     `json:"cached_blocks"`
	PrefixHitRate  float64 `json:"prefix_hit_rate"`
	// DPSize is the worker's data-parallel ranks; Ranks what its local
	// router last scraped of each rank's engine metrics.
	DPSize int          `json:"dp_size"`
	Ranks  []RankStatus `json:"ranks"`
	// Warning is the local router's configuration guard: why nothing this
	// worker caches is indexed, and the flag that fixes it.
	Warning string `json:"warning,omitempty"`
}

// RankStatus is one rank's engine signals as the local router scraped
// them (localrouter/signals).
type RankStatus struct {
	DPRank     uint32  `json:"dp_rank"`
	Scraped    bool    `json:"scraped"`
	Running    float64 `json:"running"`
	Waiting    float64 `json:"waiting"`
	KVUsage    float64 `json:"kv_usage"`
	Saturation string  `json:"saturation,omitempty"`
	// Timing is the model the ttft scorer prices the rank with
	// (localrouter.Router.CalibrationOf), in one line.
	Timing string `json:"timing"`
}

// timingLine writes a rank's timing model for the status page: where it
// comes from, its samples and error, one chunk's prefill, the decode step
// at an empty and a full KV cache, and the queue; then, where the engine's
// latency histograms are scraped, the samples they gave and the last
// interval's mean time to first token and inter-token latency.
func timingLine(c localrouter.WorkerCalibration, chunk int) string {
	src := "prior"
	switch {
	case c.Pinned:
		src = "pinned"
	case c.Fitted:
		src = "fitted"
	}
	line := fmt.Sprintf("%s (%d samples of %d in the pool, error %.0f%%, speed ×%.2f): prefill %.0f ms/%d tokens, decode %.1f–%.1f ms, queue %.0f ms",
		src, c.Samples, c.PoolSamples, 100*c.Error, c.Speed, c.Model.Prefill(chunk), chunk, c.Model.Decode(0), c.Model.Decode(1), c.Model.QueueMs)
	if c.Histograms {
		// The engine's own histograms: how many samples they gave, and
		// the last scrape interval's means as the engine measured them.
		line += fmt.Sprintf("; engine histograms: %d samples, TTFT %.0f ms, ITL %.1f ms", c.HistogramSamples, c.EngineTTFTMs, c.EngineITLMs)
	}
	return line
}

// Status snapshots the system.
func (s *System) Status() Status {
	st := Status{
		Uptime: time.Since(s.started).Round(time.Second).String(), Gateway: s.GatewayURL(),
		Extproc: s.extprocAddr, Etcd: s.etcd.endpoints, NATS: s.nats.URL(), Model: s.cfg.Model,
	}
	health := map[string][2]int{}
	state := map[string]string{}
	hs := s.Global.Health()
	for _, rg := range s.Regions { // a region's pools are its router's
		hs = append(hs, rg.Router.Health()...)
	}
	for _, h := range hs {
		health[h.Pool] = [2]int{h.Health.Routers, h.Health.Available}
		state[h.Pool] = status.PoolState(h)
	}
	for _, p := range s.Pools {
		ps := PoolStatus{Name: p.Name, Role: string(p.Role), Router: p.Router.GRPCAddr(), RouterState: state[p.Name],
			RoutersKnown: health[p.Name][0], RoutersUp: health[p.Name][1], RouterIsStopped: p.stopped.Load()}
		if !ps.RouterIsStopped {
			ps.RequestsActive = p.Requests()
			ps.IndexBlocks = p.Router.Router().Index().Stats().Nodes
		}
		loads := p.Loads()
		for _, w := range p.Workers {
			ws := WorkerStatus{ID: w.ID, Address: w.Addr, DPSize: w.DPSize}
			if !ps.RouterIsStopped {
				r := p.Router.Router()
				for rank := range w.DPSize {
					key := localrouter.WorkerKey{ID: w.ID, DPRank: uint32(rank)}
					rs := RankStatus{DPRank: uint32(rank), Timing: timingLine(r.CalibrationOf(key), r.TTFTChunk())}
					if smp, ok := r.EngineSignals(key); ok {
						rs.Scraped, rs.Running, rs.Waiting, rs.KVUsage = true, smp.Running, smp.Waiting, smp.KVUsage
						rs.Saturation = r.Config().Saturation(smp)
					}
					ws.Ranks = append(ws.Ranks, rs)
				}
			}
			for k, l := range loads {
				if k.ID == w.ID {
					ws.ActiveRequests += l.ActiveRequests
					ws.PrefillTokens += l.PrefillTokens
					ws.ActiveBlocks += l.ActiveBlocks
					if ws.Warning == "" && !ps.RouterIsStopped {
						ws.Warning = p.Router.Router().ConfigWarning(k)
					}
				}
			}
			es := w.Stats()
			ws.Running, ws.Waiting, ws.KVUsage, ws.CachedBlocks = es.Running, es.Waiting, es.KVUsage, es.CachedBlocks
			if es.PrefixQueryTokens > 0 {
				ws.PrefixHitRate = float64(es.PrefixHitTokens) / float64(es.PrefixQueryTokens)
			}
			ps.Workers = append(ps.Workers, ws)
		}
		sort.Slice(ps.Workers, func(i, j int) bool { return ps.Workers[i].ID < ps.Workers[j].ID })
		st.Pools = append(st.Pools, ps)
	}
	return st
}

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"mul100": func(f float64) float64 { return 100 * f },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="2"><title>kvgate up</title>
<style>body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:.3em .7em;text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
code{background:#f4f4f4;padding:0 .3em}</style></head><body>
<h1>kvgate up</h1>
<p>up {{.Uptime}} · model <code>{{.Model}}</code> · gateway <code>{{.Gateway}}</code> · ext_proc <code>{{.Extproc}}</code> ·
etcd <code>{{range .Etcd}}{{.}} {{end}}</code> · NATS <code>{{.NATS}}</code> ·
<a href="/kvgate/metrics">metrics</a> · <a href="/kvgate/status.json">json</a> · <a href="/kvgate/status/">live status</a></p>
{{range .Pools}}
<h2>{{.Name}}{{if ne .Role "aggregated"}} ({{.Role}}){{end}}</h2>
<p>local router <code>{{.Router}}</code>{{if .RouterIsStopped}} (stopped){{end}} · seen by the global router: {{.RouterState}} ({{.RoutersUp}}/{{.RoutersKnown}} available) ·
requests in flight {{.RequestsActive}} · blocks indexed {{.IndexBlocks}}</p>
<table><tr><th>worker</th><th>address</th><th>active requests</th><th>prefill tokens pending</th><th>active blocks</th>
<th>engine running</th><th>waiting</th><th>KV usage</th><th>cached blocks</th><th>prefix hit rate</th><th>DP ranks</th><th>engine signals the router scraped, and the timing model it prices the rank with, per rank</th></tr>
{{range .Workers}}<tr><td>{{.ID}}</td><td>{{.Address}}</td><td>{{.ActiveRequests}}</td><td>{{.PrefillTokens}}</td><td>{{.ActiveBlocks}}</td>
<td>{{.Running}}</td><td>{{.Waiting}}</td><td>{{printf "%.1f%%" (mul100 .KVUsage)}}</td><td>{{.CachedBlocks}}</td><td>{{printf "%.1f%%" (mul100 .PrefixHitRate)}}</td><td>{{.DPSize}}</td>
<td>{{range .Ranks}}rank {{.DPRank}}: {{if .Scraped}}running {{.Running}}, waiting {{.Waiting}}, KV {{printf "%.1f%%" (mul100 .KVUsage)}}{{if .Saturation}} ({{.Saturation}}){{end}}{{else}}not scraped{{end}}; timing {{.Timing}}<br>{{end}}</td></tr>
{{if .Warning}}<tr><td colspan="12" style="text-align:left;color:#a00">⚠ {{.ID}}: {{.Warning}}</td></tr>{{end}}
{{end}}</table>
{{end}}
</body></html>
`))

func (s *System) statusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /kvgate/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /kvgate/status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Status())
	})
	mux.HandleFunc("GET /kvgate/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/html; charset=utf-8")
		_ = statusPage.Execute(w, s.Status())
	})
	mux.Handle("/kvgate/status/", s.Live.Handler("/kvgate/status"))
	mux.HandleFunc("/kvgate/", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	return mux
}
