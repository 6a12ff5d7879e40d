package localrouter

import (
	"fmt"
	"slices"
	"strconv"
)

// No silent knob: a setting the running worker chain does not read is
// named, with why, where it is set (the local router's start, its Workers
// and Stats answers, kvgate policy check), never passed over in silence.

// Which chain entries read which settings.
const (
	// costReads: the cost scorer reads overlap_score_credit,
	// prefill_load_scale, track_active_blocks and the engine-signal
	// weights (the engine term of Dynamo's cost).
	costReads = "the `cost` scorer"
	// saturationReads: the saturation filter reads the saturation
	// thresholds.
	saturationReads = "the `saturation` filter"
)

// engineEntries are the chain entries whose signal is the workers' engine
// metrics (localrouter/signals): without scraping they see nothing and
// score every worker alike (the chain then degrades to its other terms).
var engineEntries = map[string]string{
	waitingName:     "scores every worker 0",
	runningName:     "scores every worker 0",
	kvUsageName:     "scores every worker 0",
	"lora":          "leaves no worker out",
	"lora-affinity": "scores every worker alike",
}

// Unread lists, one line each, the settings of c that take no effect under
// its worker chain (a value other than DefaultConfig's that no entry of
// the chain reads, or that an entry's own argument replaces), and the
// chain entries that read engine metrics when scraped is false (the router
// scrapes none). Each line names the setting (its pools-file name, its
// flag and its Dynamo variable where it has one) and why. Empty: every
// setting takes effect.
func (c Config) Unread(scraped bool) []string {
	specs := c.WorkerChain
	if len(specs) == 0 {
		specs = DefaultWorkerChain()
	}
	chain := FormatWorkerChain(specs)
	var costSpec, satSpec *ScorerSpec
	for i := range specs {
		switch specs[i].Name {
		case costName:
			costSpec = &specs[i]
		case saturationName:
			satSpec = &specs[i]
		}
	}
	d := DefaultConfig()
	var out []string
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	type knob struct {
		name, flag, env string
		set             bool
		value           string
		arg             string // the entry's argument that replaces it
		engine          bool   // read only where engine metrics are scraped
	}
	check := func(reader string, spec *ScorerSpec, k knob) {
		if !k.set {
			return
		}
		what := fmt.Sprintf("%s (--%s", k.name, k.flag)
		if k.env != "" {
			what += ", " + k.env
		}
		what += ") = " + k.value
		switch {
		case spec == nil:
			out = append(out, fmt.Sprintf("%s is read by %s only; this router's chain is %s", what, reader, chain))
		case k.arg != "" && spec.Args[k.arg] != "":
			out = append(out, fmt.Sprintf("%s is replaced by the chain's %s argument %s=%s", what, spec.Name, k.arg, spec.Args[k.arg]))
		case k.engine && !scraped:
			out = append(out, fmt.Sprintf("%s needs the workers' engine metrics, which this router does not scrape (--router-metrics-period 0)", what))
		}
	}
	check(costReads, costSpec, knob{name: "overlap_score_credit", flag: "router-overlap-score-credit", env: "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT",
		set: c.OverlapScoreCredit != d.OverlapScoreCredit, value: num(c.OverlapScoreCredit), arg: "credit"})
	check(costReads, costSpec, knob{name: "prefill_load_scale", flag: "router-prefill-load-scale", env: "DYN_ROUTER_PREFILL_LOAD_SCALE",
		set: c.PrefillLoadScale != d.PrefillLoadScale, value: num(c.PrefillLoadScale), arg: "scale"})
	check(costReads, costSpec, knob{name: "track_active_blocks", flag: "router-track-active-blocks",
		set: c.TrackActiveBlocks != d.TrackActiveBlocks, value: strconv.FormatBool(c.TrackActiveBlocks)})
	check(costReads, costSpec, knob{name: "waiting_weight", flag: "router-waiting-weight",
		set: c.WaitingWeight != d.WaitingWeight, value: num(c.WaitingWeight), engine: true})
	check(costReads, costSpec, knob{name: "kv_usage_weight", flag: "router-kv-usage-weight",
		set: c.KVUsageWeight != d.KVUsageWeight, value: num(c.KVUsageWeight), engine: true})
	check(saturationReads, satSpec, knob{name: "saturation_waiting", flag: "router-saturation-waiting",
		set: c.SaturationWaiting != d.SaturationWaiting, value: strconv.Itoa(c.SaturationWaiting), arg: "waiting", engine: true})
	check(saturationReads, satSpec, knob{name: "saturation_kv_usage", flag: "router-saturation-kv-usage",
		set: c.SaturationKVUsage != d.SaturationKVUsage, value: num(c.SaturationKVUsage), arg: "kv_usage", engine: true})
	// The index's lifetimes: each is read by one index mode only.
	if c.UseKVEvents && c.TTL != d.TTL {
		out = append(out, fmt.Sprintf("ttl (--router-ttl) = %v is read by the approximate index only; this router indexes KV events (--router-use-kv-events=true)", c.TTL))
	}
	if !c.UseKVEvents && c.PredictedTTL != d.PredictedTTL {
		out = append(out, fmt.Sprintf("predicted_ttl (--router-predicted-ttl) = %v is read with KV events only; this router runs the approximate index (--router-use-kv-events=false)", c.PredictedTTL))
	}
	if !scraped {
		for _, sp := range specs {
			if does, ok := engineEntries[sp.Name]; ok {
				out = append(out, fmt.Sprintf("worker chain entry %q reads the workers' engine metrics, which this router does not scrape (--router-metrics-period 0): it %s", sp.Name, does))
			}
			if sp.Name == saturationName && (sp.Args["waiting"] != "" || sp.Args["kv_usage"] != "") {
				out = append(out, fmt.Sprintf("worker chain entry %q has thresholds but reads the workers' engine metrics, which this router does not scrape (--router-metrics-period 0): it leaves no worker out", sp.String()))
			}
		}
	}
	return out
}

// EngineMetricEntries lists the entries of chain (DefaultWorkerChain when
// empty) that read the workers' engine metrics: without scraping
// (kvgate localrouter --router-metrics-period) they see nothing.
func EngineMetricEntries(chain []ScorerSpec) []string {
	if len(chain) == 0 {
		chain = DefaultWorkerChain()
	}
	var out []string
	for _, sp := range chain {
		if _, ok := engineEntries[sp.Name]; ok || (sp.Name == saturationName && (sp.Args["waiting"] != "" || sp.Args["kv_usage"] != "")) {
			out = append(out, sp.Name)
		}
	}
	return out
}

// readsOverride reports whether the chain reads a ConfigOverride's
// overlap_score_credit and prefill_load_scale (it has the cost scorer).
func (c *workerChain) readsOverride() bool { return c.cost }

// builtinEntry reports whether name is a built-in filter or scorer (one
// registered from Go may read any of the request).
func builtinEntry(name string) bool {
	filters, scorers := ChainEntries()
	return slices.Contains(filters, name) || slices.Contains(scorers, name)
}

// SessionNote is the warning a router logs, once, when a request carries
// a session key (the global router's x-kvgate-session-id) its chain does
// not read.
func SessionNote(chain []ScorerSpec) string {
	if len(chain) == 0 {
		chain = DefaultWorkerChain()
	}
	return "a request's session key (x-kvgate-session-id, Prompt.session_key) is read by the `session` scorer only; this router's chain is " +
		FormatWorkerChain(chain) + ": ignored (logged once)"
}

// OverrideNote is the warning a router logs, once, when a request's
// override sets cost parameters its chain does not read.
func OverrideNote(chain []ScorerSpec) string {
	if len(chain) == 0 {
		chain = DefaultWorkerChain()
	}
	return "a request's overlap_score_credit or prefill_load_scale override (x-kvgate-overlap-score-credit, x-kvgate-prefill-load-scale) is read by the `cost` scorer only; this router's chain is " +
		FormatWorkerChain(chain) + ": ignored (logged once)"
}
