package status

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
)

var pageTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"pct": func(f float64) string {
		if f < 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f%%", 100*f)
	},
	"join": strings.Join,
	"clock": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.UTC().Format("15:04:05.000")
	},
	"explainInterval": func() string { return globalrouter.ObserverExplainInterval.String() },
	"stateClass": func(s string) string {
		switch s {
		case "ok", "closed":
			return "ok"
		case "recovering", "half-open", "not probed yet":
			return "warn"
		}
		return "bad"
	},
	"inflight": func(n int) string {
		if n < 0 {
			return "–"
		}
		return fmt.Sprint(n)
	},
}).Parse(`
{{define "page"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1f2328}
h1{margin:0 0 .3em}h2{margin:1.2em 0 .3em}
table{border-collapse:collapse;margin:.4em 0 1em}
td,th{border:1px solid #d0d7de;padding:.25em .6em;text-align:right;vertical-align:top}
th{background:#f6f8fa}td.l,th.l{text-align:left}
code{background:#f6f8fa;padding:0 .3em}
.ok{color:#1a7f37}.warn{color:#9a6700}.bad{color:#cf222e;font-weight:bold}
.expl{font-family:ui-monospace,monospace;font-size:.8em;max-width:60em;text-align:left;white-space:normal}
#live-indicator{font-size:.8em;color:#57606a}.muted{color:#8c959f}
</style></head><body>
<h1>{{.Title}}</h1>
<p id="live-indicator">rendered at {{clock .Time}} UTC<noscript> · JavaScript is off: reload the page for fresh numbers</noscript></p>
<div id="live">{{template "live" .}}</div>
<script>
(function(){
  var el=document.getElementById("live"), ind=document.getElementById("live-indicator");
  function tick(){
    fetch("fragment",{cache:"no-store"}).then(function(r){
      if(!r.ok) throw new Error(r.status);
      return r.text();
    }).then(function(t){
      el.innerHTML=t;
      ind.textContent="live · updated "+new Date().toISOString().substr(11,12)+" UTC";
      ind.dataset.updates=String(Number(ind.dataset.updates||0)+1);
    }).catch(function(e){ ind.textContent="live updates paused: "+e; });
  }
  setInterval(tick,1000);
})();
</script>
</body></html>{{end}}

{{define "live"}}
<p>{{range $i, $f := .Info}}{{if $i}} · {{end}}{{$f.Label}} <code>{{$f.Value}}</code>{{end}}</p>
{{range .Pools}}
<h2 id="pool-{{.Name}}">{{.Name}} <small>({{.Role}})</small> <span class="{{stateClass .State}}" data-field="state">{{.State}}</span></h2>
<p>in flight <b data-field="pool-in-flight">{{inflight .InFlight}}</b> · blocks indexed <span data-field="index-blocks">{{.IndexBlocks}}</span> · decisions <span data-field="decisions">{{printf "%.0f" .Decisions}}</span>
{{range .Routers}} · local router <code>{{.Address}}</code> circuit <span class="{{stateClass .Circuit}}">{{.Circuit}}</span>{{if .Failures}} ({{.Failures}} failures){{end}}{{end}}</p>
{{if .Workers}}<table class="workers" data-pool="{{.Name}}">
<thead><tr><th class="l">worker</th><th class="l">address</th><th>in flight</th><th>prefill tokens pending</th><th>KV usage</th><th>cached blocks</th><th>hit rate (window)</th><th class="l">hit rate over time</th></tr></thead>
<tbody>{{range .Workers}}<tr data-worker="{{.ID}}"><td class="l">{{.ID}}</td><td class="l">{{.Address}}</td>
<td data-field="in-flight">{{.InFlight}}</td><td data-field="prefill-tokens">{{.PrefillTokens}}</td>
<td data-field="kv-usage">{{pct .KVUsage}}</td><td data-field="cached-blocks">{{.CachedBlocks}}</td>
<td data-field="hit-rate">{{pct .HitRate}}</td><td class="l">{{.Chart}}</td></tr>{{end}}</tbody></table>{{end}}
{{end}}
<h2>Last decisions</h2>
{{if .Decisions}}<table id="decisions"><thead><tr><th class="l">time (UTC)</th><th class="l">request</th><th class="l">model</th><th class="l">outcome</th><th class="l">pool / worker</th><th>overlap</th><th>µs</th><th class="l">why <small>(explained on a sample: at most one decision every {{explainInterval}}, the others blank; x-kvgate-explain: 1 explains a request of yours)</small></th></tr></thead>
<tbody>{{range .Decisions}}<tr><td class="l">{{clock .Time}}</td><td class="l">{{.RequestID}}</td><td class="l">{{.Model}}</td><td class="l {{stateClass .Outcome}}">{{.Outcome}}</td>
<td class="l">{{.Pool}}{{if .Worker}} / {{.Worker}}{{end}}</td><td>{{.Overlap}}/{{.Blocks}}</td><td>{{.Micros}}</td><td class="expl">{{if .Explanation}}{{.Explanation}}{{else}}<span class="muted">not sampled</span>{{end}}</td></tr>{{end}}</tbody></table>
{{else}}<p>No decision yet.</p>{{end}}
<h2>Flow control</h2>
{{if .Flow}}<table id="flow-control"><thead><tr><th class="l">pools</th><th class="l">band</th><th>waiting</th><th>bytes</th><th class="l">flows (tenants)</th></tr></thead>
<tbody>{{range .Flow}}<tr data-band="{{.Band}}"><td class="l">{{.Pools}}</td><td class="l">{{.Band}}</td><td data-field="flow-waiting">{{.Requests}}</td><td>{{.Bytes}}</td><td class="l">{{.Flows}}</td></tr>{{end}}</tbody></table>
{{else}}<p>No request has waited{{if eq .Config.FlowControl "off"}} (flow control is off){{end}}.</p>{{end}}
<h2>Configuration</h2>
<table id="config"><tbody>
<tr><th class="l">file</th><td class="l"><code>{{if .Config.File}}{{.Config.File}}{{else}}(built in code){{end}}</code></td></tr>
<tr><th class="l">chain</th><td class="l">{{join .Config.Chain " → "}}</td></tr>
<tr><th class="l">shadow chain</th><td class="l">{{if .Config.ShadowChain}}{{join .Config.ShadowChain " → "}}{{else}}none{{end}}</td></tr>
<tr><th class="l">pools</th><td class="l">{{.Config.Pools}}</td></tr>
<tr><th class="l">probe</th><td class="l">{{.Config.Probe}}</td></tr>
<tr><th class="l">flow control</th><td class="l">{{.Config.FlowControl}}</td></tr>
<tr><th class="l">last reload</th><td class="l">{{clock .Config.LastReload}}{{if .Config.ReloadError}} <span class="bad">refused: {{.Config.ReloadError}}</span>{{else}} <span class="ok">taken</span>{{end}}</td></tr>
</tbody></table>
{{end}}
`))
