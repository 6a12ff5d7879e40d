package flowcontrol

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults of Config, each with its principle (docs/flow-control.md).
const (
	// DefaultRequests bounds a queue's waiting requests: each holds an
	// ext_proc stream, a goroutine and its body in the ext_proc server.
	DefaultRequests = 1024
	// DefaultBytes bounds the bodies a queue holds (256 MiB): sixteen
	// bodies at the ext_proc server's 16 MiB cap, a thousand of 256 KiB.
	DefaultBytes = 256 << 20
	// DefaultDeadline is how long a request without a TTFT target may
	// wait: below Envoy's default route timeout (15 s), so the client
	// gets a 429 with retry-after rather than Envoy's 504.
	DefaultDeadline = 10 * time.Second
	// DefaultReprobe is the live queue's re-probe tick: pools are freed
	// by other global routers too, whose frees this one does not see.
	// 50 ms is a decode step or two of a loaded engine.
	DefaultReprobe = 50 * time.Millisecond
	// DefaultMaxPrefillTokens: a pool whose best worker has more prompt
	// tokens waiting to prefill than two engine steps prefill (2 × vLLM's
	// max_num_batched_tokens, 8192, the mocker's and the replay's
	// default) is saturated. Taken from the replay (BENCHMARKS.md, "Flow
	// control's cost per request"): one step's worth (8192) queued
	// requests the workers would have served in time; 32768 and more
	// served fewer under overload.
	DefaultMaxPrefillTokens = 16384
	// DefaultLowerBandShare: the bands below the top one are saturated at
	// a quarter of its max_prefill_tokens (4,096 of 16,384: half an engine
	// step), so a top-band request arriving at a worker waits behind at
	// most half a step of theirs. Taken from the replay on both traces
	// (BENCHMARKS.md, "Flow control: headroom for the high band"): 1 (the
	// same mark) and 0.5 left the high band's p99 at 2× 1.6-3.0× its
	// 0.7×; 0.125 and a single token starved the low band at 0.7× on the
	// agentic trace.
	DefaultLowerBandShare = 0.25
	// DefaultMaxFlowLabels caps the tenants that get their own metric
	// label; the others are counted as "other".
	DefaultMaxFlowLabels = 32
)

// Fairness policies (Config.Fairness).
const (
	FairnessRoundRobin = "round_robin"
	FairnessWeighted   = "weighted"
	FairnessShortest   = "shortest"
)

// Config is a global router's flow control (its YAML section
// flow_control). The zero value, with Enabled, is the defaults.
type Config struct {
	// Enabled turns flow control on: a request whose candidate pools are
	// all saturated waits instead of being refused with 429.
	Enabled bool `yaml:"enabled"`
	// Bands order the queue by priority (x-kvgate-priority), highest
	// first: a request belongs to the first band whose min_priority it
	// reaches; the last band has no min_priority and takes the rest.
	// Default: "high" (min_priority 1) and "default".
	Bands []Band `yaml:"bands"`
	// Capacity bounds each queue (one per set of pools a model is served
	// by) in requests and body bytes (defaults DefaultRequests,
	// DefaultBytes).
	Capacity Capacity `yaml:"capacity"`
	// Deadline is the longest a request waits (default DefaultDeadline);
	// a request with a TTFT target (x-kvgate-ttft-ms) waits at most that.
	Deadline time.Duration `yaml:"deadline"`
	// Fairness shares a band between flows (tenants, by the tenancy
	// header; untenanted requests are one flow): round_robin (default),
	// weighted by Weights, or shortest (the flow whose oldest request is
	// the smallest goes next: more requests served per prefilled token,
	// at the cost of the turn-taking; Shortest).
	Fairness string `yaml:"fairness"`
	// Weights are the tenants' shares under weighted fairness (default
	// 1); read only by weighted.
	Weights map[string]float64 `yaml:"weights"`
	// Objectives map the Inference Extension's InferenceObjectives to
	// priorities: a request naming one in x-gateway-inference-objective
	// (globalrouter.HeaderObjective) has its priority, unless an honoured
	// x-kvgate-priority sets one; a name not listed is priority 0, as the
	// endpoint picker does. Read by the global router per request.
	Objectives []Objective `yaml:"objectives"`
	// ObjectivesFile is a file of InferenceObjective manifests (relative
	// to the configuration file; ParseObjectives) whose objectives are
	// read as Objectives too.
	ObjectivesFile string `yaml:"objectives_file"`
	// InferencePool keeps, of ObjectivesFile's objectives, those whose
	// poolRef names this InferencePool ("": every one); read only with
	// ObjectivesFile.
	InferencePool string `yaml:"inference_pool"`
	// Reprobe is the live queue's re-probe tick (default
	// DefaultReprobe): besides the frees of its own requests, the queue
	// tries its head this often.
	Reprobe time.Duration `yaml:"reprobe"`
	// Saturation says when a pool is saturated.
	Saturation Saturation `yaml:"saturation"`
	// MaxFlowLabels caps the tenants named in metrics (default
	// DefaultMaxFlowLabels); the rest are "other".
	MaxFlowLabels int `yaml:"max_flow_labels"`
}

// Band is one priority band.
type Band struct {
	// Name labels the band in metrics and the status page.
	Name string `yaml:"name"`
	// MinPriority: requests of this priority or higher belong here
	// (unless an earlier band takes them). nil: every priority (the last
	// band only).
	MinPriority *int `yaml:"min_priority"`
	// Requests and Bytes bound the band (0: only the queue's Capacity).
	Requests int   `yaml:"requests"`
	Bytes    int64 `yaml:"bytes"`
	// Saturation, when set, is the band's own rule in place of the
	// queue's (Config.Saturation): a lower band given a lower mark leaves
	// the engines headroom for the bands above it (SaturationFor).
	Saturation *Saturation `yaml:"saturation"`
}

// Capacity bounds a queue.
type Capacity struct {
	Requests int   `yaml:"requests"`
	Bytes    int64 `yaml:"bytes"`
}

// Saturation is the rule that says a pool is saturated, on its probe's
// answer (the best worker's figures): the rule of the priority policy's
// shed (policies.LoadThresholds). A pool is saturated when one figure is
// strictly above its threshold (0: not checked).
type Saturation struct {
	// MaxPrefillTokens bounds the best worker's potential prefill tokens
	// (default DefaultMaxPrefillTokens; -1: not checked).
	MaxPrefillTokens int `yaml:"max_prefill_tokens"`
	// MaxDecodeTokens bounds its potential decode blocks × block size
	// (default 0, not checked: the probe does not know the worker's KV
	// capacity; set it to ~90 % of it).
	MaxDecodeTokens int `yaml:"max_decode_tokens"`
	// LowerBandShare is the share of MaxPrefillTokens the bands below
	// the top one are saturated at (default DefaultLowerBandShare; 1: the
	// same mark): the headroom left for the top band. A band's own
	// saturation replaces it.
	LowerBandShare float64 `yaml:"lower_band_share"`
}

// ErrConfig is the error of an invalid Config.
var ErrConfig = errors.New("invalid flow_control")

// DefaultBands are the bands of a Config that sets none.
func DefaultBands() []Band {
	one := 1
	return []Band{{Name: "high", MinPriority: &one}, {Name: "default"}}
}

// Defaults fills in what is unset.
func (c *Config) Defaults() {
	if len(c.Bands) == 0 {
		c.Bands = DefaultBands()
	}
	for i := range c.Bands {
		if c.Bands[i].Name == "" {
			c.Bands[i].Name = fmt.Sprintf("band%d", i)
		}
	}
	if c.Capacity.Requests == 0 {
		c.Capacity.Requests = DefaultRequests
	}
	if c.Capacity.Bytes == 0 {
		c.Capacity.Bytes = DefaultBytes
	}
	if c.Deadline == 0 {
		c.Deadline = DefaultDeadline
	}
	if c.Fairness == "" {
		c.Fairness = FairnessRoundRobin
	}
	if c.Reprobe == 0 {
		c.Reprobe = DefaultReprobe
	}
	if c.Saturation.MaxPrefillTokens == 0 {
		c.Saturation.MaxPrefillTokens = DefaultMaxPrefillTokens
	}
	if c.Saturation.LowerBandShare == 0 {
		c.Saturation.LowerBandShare = DefaultLowerBandShare
	}
	if c.MaxFlowLabels == 0 {
		c.MaxFlowLabels = DefaultMaxFlowLabels
	}
}

// Problem is one error of a Config: Key locates it in the section
// ("bands[1].min_priority", "capacity"), for file:line.
type Problem struct {
	Key string
	Msg string
}

func (p Problem) Error() string {
	return fmt.Sprintf("%v: flow_control.%s: %s", ErrConfig, p.Key, p.Msg)
}

func (p Problem) Unwrap() error { return ErrConfig }

// Validate checks c (defaults applied) and returns every problem.
func (c *Config) Validate() []Problem {
	var out []Problem
	bad := func(key, format string, args ...any) {
		out = append(out, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	names := map[string]bool{}
	for i, b := range c.Bands {
		key := fmt.Sprintf("bands[%d]", i)
		last := i == len(c.Bands)-1
		switch {
		case names[b.Name]:
			bad(key+".name", "band %q named twice", b.Name)
		case last && b.MinPriority != nil:
			bad(key+".min_priority", "the last band takes every priority left: no min_priority")
		case !last && b.MinPriority == nil:
			bad(key+".min_priority", "required (only the last band has none)")
		case i > 0 && b.MinPriority != nil && *b.MinPriority >= *c.Bands[i-1].MinPriority:
			bad(key+".min_priority", "%d: bands go from the highest priority down (the previous band's is %d)", *b.MinPriority, *c.Bands[i-1].MinPriority)
		}
		names[b.Name] = true
		if b.Requests < 0 || b.Bytes < 0 {
			bad(key, "requests and bytes must not be negative")
		}
		if s := b.Saturation; s != nil && (s.MaxPrefillTokens < -1 || s.MaxDecodeTokens < 0) {
			bad(key+".saturation", "thresholds must not be negative (max_prefill_tokens -1: not checked, 0: the queue's)")
		}
		if s := b.Saturation; s != nil && s.LowerBandShare != 0 {
			bad(key+".saturation.lower_band_share", "read from flow_control.saturation only")
		}
	}
	if c.Capacity.Requests < 0 || c.Capacity.Bytes < 0 {
		bad("capacity", "requests and bytes must not be negative")
	}
	if c.Deadline < 0 {
		bad("deadline", "%v must not be negative", c.Deadline)
	}
	if c.Reprobe < 0 {
		bad("reprobe", "%v must not be negative", c.Reprobe)
	}
	switch c.Fairness {
	case FairnessRoundRobin, FairnessShortest:
		if len(c.Weights) > 0 {
			bad("weights", "read only by fairness: weighted (fairness is %s)", c.Fairness)
		}
	case FairnessWeighted:
		for t, w := range c.Weights {
			if !(w > 0) || math.IsInf(w, 0) {
				bad("weights", "tenant %q: weight %v is not a positive number", t, w)
			}
		}
	default:
		bad("fairness", "%q: want %s, %s or %s", c.Fairness, FairnessRoundRobin, FairnessWeighted, FairnessShortest)
	}
	if c.Saturation.MaxPrefillTokens < -1 || c.Saturation.MaxDecodeTokens < 0 {
		bad("saturation", "thresholds must not be negative (max_prefill_tokens -1: not checked)")
	}
	if x := c.Saturation.LowerBandShare; !(x >= 0 && x <= 1) {
		bad("saturation.lower_band_share", "%v: want a share above 0, at most 1", x)
	}
	seen := map[string]bool{}
	for i, o := range c.Objectives {
		key := fmt.Sprintf("objectives[%d].name", i)
		switch {
		case len(o.Name) == 0 || len(o.Name) > 253 || !dnsSubdomain.MatchString(o.Name):
			bad(key, "%q is not an InferenceObjective name (lower-case letters, digits, '-' and '.', at most 253)", o.Name)
		case seen[o.Name]:
			bad(key, "objective %q listed twice", o.Name)
		}
		seen[o.Name] = true
	}
	if c.InferencePool != "" && c.ObjectivesFile == "" {
		bad("inference_pool", "read only with objectives_file (it picks the file's objectives by poolRef)")
	}
	if c.MaxFlowLabels < 0 {
		bad("max_flow_labels", "%d must not be negative", c.MaxFlowLabels)
	}
	return out
}

// SaturationFor is the saturation rule of priority p's band (defaults
// applied): the band's own when set (its unset max_prefill_tokens the
// queue's); else the queue's for the top band, and for the bands below it
// the queue's with max_prefill_tokens scaled by lower_band_share (at
// least 1 token).
func (c *Config) SaturationFor(p int) Saturation {
	if len(c.Bands) == 0 {
		return c.Saturation
	}
	return c.BandSaturation(c.band(p))
}

// BandSaturation is band i's saturation rule (SaturationFor).
func (c *Config) BandSaturation(i int) Saturation {
	out := c.Saturation
	if i < 0 || i >= len(c.Bands) {
		return out
	}
	if s := c.Bands[i].Saturation; s != nil {
		if s.MaxDecodeTokens != 0 {
			out.MaxDecodeTokens = s.MaxDecodeTokens
		}
		if s.MaxPrefillTokens != 0 {
			out.MaxPrefillTokens = s.MaxPrefillTokens
		}
		return out
	}
	if share := out.LowerBandShare; i > 0 && share > 0 && share < 1 && out.MaxPrefillTokens > 0 {
		out.MaxPrefillTokens = max(1, int(float64(out.MaxPrefillTokens)*share))
	}
	return out
}

// band returns the index of the band priority p belongs to.
func (c *Config) band(p int) int {
	for i, b := range c.Bands {
		if b.MinPriority == nil || p >= *b.MinPriority {
			return i
		}
	}
	return len(c.Bands) - 1
}
