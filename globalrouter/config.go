package globalrouter

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// Config is the global router's configuration: how to probe, the policy
// chain, the models' tokenizers and the pools. LoadConfig reads it from
// YAML (examples/pools.yaml); code builds it with DefaultConfig and
// pool.NewConfig.
type Config struct {
	Probe ProbeConfig `yaml:"probe"`
	// Trust says which callers may steer routing and see how they were
	// routed.
	Trust TrustConfig `yaml:"trust"`
	// Tenancy separates tenants' caches.
	Tenancy TenancyConfig `yaml:"tenancy"`
	// Chain is the pool selection chain, run in order (policies package).
	Chain []policies.Spec `yaml:"chain"`
	// Models configure tokenizers; a served model without an entry uses
	// DefaultTokenizer.
	Models []ModelConfig `yaml:"models"`
	Pools  []pool.Config `yaml:"pools"`
	// Shadow is a candidate chain run alongside the live one (shadow.go).
	Shadow *ShadowConfig `yaml:"shadow"`
	// FlowControl queues requests whose pools are all saturated instead
	// of refusing them (flow.go, package flowcontrol).
	FlowControl flowcontrol.Config `yaml:"flow_control"`

	// File is where the configuration was read from ("" when built in Go).
	File string `yaml:"-"`
	// sum is the SHA-256 of the file's content (WatchFile's baseline).
	sum [32]byte
	// shadowChain is Shadow's chain, built by validate.
	shadowChain *policies.Chain
	// objectives are FlowControl's objectives (its list and its file's),
	// by name: their priorities, built by validate (objective.go).
	objectives map[string]int
	// at locates the sections validate's errors name ("probe",
	// "models[i]") in the file, for file:line:column (nil: built in Go).
	at map[string]*yaml.Node
}

// ProbeConfig bounds the probes of the pools' local routers, says when a
// local router's circuit opens (package pool, CircuitOptions), and how
// passive health ejects workers whose connections fail.
type ProbeConfig struct {
	// Timeout is the longest a probe may take (default 250 ms);
	// MinTimeout the shortest deadline a probe is given (default 25 ms).
	// Between the two the deadline adapts to each router's observed probe
	// latency (4 × its p99); set both equal for a fixed deadline.
	Timeout    time.Duration `yaml:"timeout"`
	MinTimeout time.Duration `yaml:"min_timeout"`
	// BackoffBase and BackoffMax bound how long a failing local router's
	// circuit stays open (defaults 100 ms, 10 s; doubled by each failed
	// trial, at most once per open period).
	BackoffBase time.Duration `yaml:"backoff_base"`
	BackoffMax  time.Duration `yaml:"backoff_max"`
	// OpenAfterFailures hard failures in a row (default 3), or
	// OpenAfterTimeouts probes past their deadline in a row (default 10),
	// or a share of failed calls of at least FailureRatio (default 0.5)
	// over RatioWindow (default 10 s) once RatioMinCalls (default 20)
	// were made, open a router's circuit.
	OpenAfterFailures int           `yaml:"open_after_failures"`
	OpenAfterTimeouts int           `yaml:"open_after_timeouts"`
	FailureRatio      float64       `yaml:"failure_ratio"`
	RatioWindow       time.Duration `yaml:"ratio_window"`
	RatioMinCalls     int           `yaml:"ratio_min_calls"`
	// EjectBase and EjectMax bound how long passive health keeps a worker
	// whose connections fail out of the candidates (defaults 1 s, 30 s).
	EjectBase time.Duration `yaml:"eject_base"`
	EjectMax  time.Duration `yaml:"eject_max"`
	// SamePoolFallbacks is how many other recently seen workers of the
	// primary's pool are added to the fallbacks, after the other pools'
	// (default 1; -1: none).
	SamePoolFallbacks int `yaml:"same_pool_fallbacks"`
	// Commit is how the chosen pool records the request (default
	// CommitDecide; commit.go).
	Commit CommitMode `yaml:"commit"`
	// ReserveTTL is how long a reserving probe holds its worker for the
	// commit that confirms it (probe.commit: reserve only; default
	// DefaultReserveTTL, at most MaxReserveTTL). Read by the global
	// router, which sends it with each probe; set with another commit
	// mode it is refused.
	ReserveTTL time.Duration `yaml:"reserve_ttl"`
}

// The reservation TTL of probe.commit: reserve: a decision confirms or
// releases its reservations as soon as the chain has ranked the probes, so
// the TTL only bounds what a global router that dies between its probe and
// its commit leaves held; it must outlast a probe's deadline (250 ms at
// most by default) plus the ranking. MaxReserveTTL is the local routers'
// own bound (routing.MaxReserveTTL: they refuse a longer reservation).
const (
	DefaultReserveTTL = 500 * time.Millisecond
	MaxReserveTTL     = routing.MaxReserveTTL
)

// CommitMode is how the global router commits a request on the pool the
// chain ranked first.
type CommitMode string

const (
	// CommitDecide (the default): the pool's local router chooses the
	// worker and records the request in one call (decide-and-commit,
	// within the request's subset less the ejected workers), and the
	// decision waits for its answer: a burst of identical prompts spreads
	// over the workers instead of all taking the one the probes saw idle.
	CommitDecide CommitMode = "decide"
	// CommitPipelined: the probed worker is committed on the request's
	// stream without waiting for the answer (one round trip less, but
	// probes racing ahead of commits can herd).
	CommitPipelined CommitMode = "pipelined"
	// CommitReserve: every probe reserves the worker it names for the
	// request (its load counted by every later probe, for ReserveTTL), so
	// a burst spreads as with decide; the probed worker's reservation is
	// then confirmed by a commit that is not waited for, and the other
	// pools' reservations are released. One round trip and no lock,
	// unless several pools' probes met other requests' reservations: then
	// the pools are probed again under the recheck lock (reserve.go).
	CommitReserve CommitMode = "reserve"
)

// circuit is the probe configuration's circuit options.
func (p *ProbeConfig) circuit() pool.CircuitOptions {
	return pool.CircuitOptions{Base: p.BackoffBase, Max: p.BackoffMax, Failures: p.OpenAfterFailures, Timeouts: p.OpenAfterTimeouts,
		Ratio: p.FailureRatio, Window: p.RatioWindow, MinCalls: p.RatioMinCalls}
}

// ModelConfig names a model's tokenizer.
type ModelConfig struct {
	Name      string           `yaml:"name"`
	Tokenizer tokenizer.Config `yaml:"tokenizer"`
	// LoRAOf names the base model when Name is a LoRA adapter served
	// under its own model name (vLLM's --lora-modules): its blocks are
	// hashed with the adapter's seed (kvevents.LoRASeed(Name)), as the
	// engine's KV events are, so adapters never share blocks with the base
	// model or each other.
	LoRAOf string `yaml:"lora_of"`
	// MaxBodyBytes is the largest request body the model's workers accept
	// (vLLM's or the mocker's limit; 0: no limit of its own, the ext_proc
	// server's cap applies). A larger body is refused with 413 before it
	// is tokenized (ErrBodyTooLarge).
	MaxBodyBytes int `yaml:"max_body_bytes"`
}

// DefaultTokenizer is the tokenizer of a served model the configuration
// does not list: the embedded cl100k_base encoding.
var DefaultTokenizer = tokenizer.Config{Backend: tokenizer.BackendOpenAI, Encoding: "cl100k_base"}

// DefaultChain is the chain of a configuration that sets none: keep the
// pools serving the model, pair prefill and decode pools, and rank by
// normalised local-router cost.
func DefaultChain() []policies.Spec {
	return []policies.Spec{{Name: policies.NameModelMatch}, {Name: policies.NameDisaggregate}, {Name: policies.NameCost}}
}

// DefaultConfig returns a configuration of pools with the defaults.
func DefaultConfig(pools ...pool.Config) Config {
	c := Config{Pools: pools}
	c.Defaults()
	return c
}

// Defaults fills in what is unset.
func (c *Config) Defaults() {
	if c.Probe.Timeout <= 0 {
		c.Probe.Timeout = pool.DefaultProbeTimeout
	}
	if c.Probe.MinTimeout <= 0 {
		c.Probe.MinTimeout = min(pool.DefaultProbeMinTimeout, c.Probe.Timeout)
	}
	if c.Probe.SamePoolFallbacks == 0 {
		c.Probe.SamePoolFallbacks = 1
	}
	if c.Probe.Commit == "" {
		c.Probe.Commit = CommitDecide
	}
	if c.Probe.Commit == CommitReserve && c.Probe.ReserveTTL == 0 {
		c.Probe.ReserveTTL = DefaultReserveTTL
	}
	c.Trust.defaults()
	if c.Probe.BackoffBase <= 0 {
		c.Probe.BackoffBase = pool.DefaultBackoffBase
	}
	if c.Probe.BackoffMax <= 0 {
		c.Probe.BackoffMax = pool.DefaultBackoffMax
	}
	if len(c.Chain) == 0 {
		c.Chain = DefaultChain()
	}
	for i := range c.Pools {
		c.Pools[i].Defaults()
	}
	if c.FlowControl.Enabled {
		c.FlowControl.Defaults()
	}
}

func (c *Config) file() string {
	if c.File == "" {
		return "<go>"
	}
	return c.File
}

// builtins returns reg, or a registry of the built-in policies when reg is
// nil.
func builtins(reg *policies.Registry) *policies.Registry {
	if reg != nil {
		return reg
	}
	reg = policies.NewRegistry()
	if err := policies.RegisterBuiltins(reg); err != nil {
		panic("globalrouter: built-in policies: " + err.Error()) // a duplicate among the built-ins
	}
	return reg
}

// Validate checks the pools, the models and the chain (building it with
// reg; nil: the built-in policies). Errors name the file, the line, the
// policy or pool, and the field.
func (c *Config) Validate(reg *policies.Registry) error {
	_, err := c.validate(builtins(reg))
	return err
}

// validate is Validate returning the chain it built: the Router's, built
// once per configuration.
//
// Every error is reported, not only the first (joined): one run of `kvgate
// policy check` lists them all.
func (c *Config) validate(reg *policies.Registry) (*policies.Chain, error) {
	if len(c.Pools) == 0 {
		return nil, fmt.Errorf("%s: %w: no pools", c.file(), policies.ErrConfig)
	}
	var errs []error
	fail := func(format string, args ...any) { c.failAt(&errs, "", format, args...) }
	probe := func(format string, args ...any) { c.failAt(&errs, "probe", format, args...) }
	if c.Probe.MinTimeout > c.Probe.Timeout {
		probe("probe.min_timeout %v is above probe.timeout %v", c.Probe.MinTimeout, c.Probe.Timeout)
	}
	if r := c.Probe.FailureRatio; r < 0 || r > 1 {
		probe("probe.failure_ratio %v: want a share between 0 and 1", r)
	}
	if c.Probe.OpenAfterFailures < 0 || c.Probe.OpenAfterTimeouts < 0 || c.Probe.RatioMinCalls < 0 || c.Probe.SamePoolFallbacks < -1 {
		probe("probe: counts must not be negative")
	}
	switch c.Probe.Commit {
	case CommitDecide, CommitPipelined, CommitReserve, "":
	default:
		probe("probe.commit %q: want %q, %q or %q", c.Probe.Commit, CommitDecide, CommitPipelined, CommitReserve)
	}
	switch ttl := c.Probe.ReserveTTL; {
	case ttl != 0 && c.Probe.Commit != CommitReserve:
		probe("probe.reserve_ttl %v is read only with probe.commit: %s (probe.commit is %q)", ttl, CommitReserve, c.Probe.Commit)
	case ttl < 0 || ttl > MaxReserveTTL:
		probe("probe.reserve_ttl %v: want a duration above 0 and at most %v", ttl, MaxReserveTTL)
	case ttl > 0 && ttl < time.Millisecond:
		probe("probe.reserve_ttl %v: want at least 1ms (the wire counts whole microseconds, and a commit must arrive within it)", ttl)
	}
	if err := c.Trust.validate(c.file()); err != nil {
		errs = append(errs, err)
	}
	tenancyAt := c.file()
	if n := c.at["tenancy"]; n != nil {
		tenancyAt = fmt.Sprintf("%s:%d:%d", tenancyAt, n.Line, n.Column)
	}
	if err := c.Tenancy.validate(tenancyAt); err != nil {
		errs = append(errs, err)
	}
	c.validateFlow(&errs)
	if c.Probe.BackoffMax < c.Probe.BackoffBase {
		probe("probe.backoff_max %v is below probe.backoff_base %v", c.Probe.BackoffMax, c.Probe.BackoffBase)
	}
	names := map[string]bool{}
	served := map[string]bool{}
	for i := range c.Pools {
		p := &c.Pools[i]
		if err := p.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if names[p.Name] {
			fail("pool %q defined twice", p.Name)
			continue
		}
		names[p.Name] = true
		for _, m := range p.Models {
			served[m] = true
		}
	}
	seen := map[string]bool{}
	for i, m := range c.Models {
		model := func(format string, args ...any) { c.failAt(&errs, fmt.Sprintf("models[%d]", i), format, args...) }
		switch {
		case m.Name == "":
			model("models: entry without a name")
		case seen[m.Name]:
			model("models: %q listed twice", m.Name)
		case m.MaxBodyBytes < 0:
			model("models: %q: max_body_bytes %d must not be negative", m.Name, m.MaxBodyBytes)
		case m.Tokenizer.Model != "" && m.Tokenizer.Model != m.Name:
			model("models: %q: tokenizer.model %q is not read: the tokenizer serves the entry's name (a LoRA adapter names its base with lora_of)", m.Name, m.Tokenizer.Model)
		case c.tokenizerFor(m.Name).CheckFields() != nil:
			model("models: %q: %v", m.Name, c.tokenizerFor(m.Name).CheckFields())
		case !served[m.Name] && !served["*"]:
			model("models: %q has a tokenizer but no pool serves it", m.Name)
		}
		seen[m.Name] = true
	}
	chain, err := c.buildChain(reg)
	if err != nil {
		errs = append(errs, err)
	}
	if err := c.buildShadow(reg); err != nil {
		errs = append(errs, err)
	}
	switch len(errs) {
	case 0:
		return chain, nil
	case 1:
		return nil, errs[0]
	}
	return nil, errors.Join(errs...)
}

// validateFlow checks flow_control: each problem at its line. A section
// set while flow control is off is refused: nothing would read it.
func (c *Config) validateFlow(errs *[]error) {
	fc := &c.FlowControl
	if !fc.Enabled {
		if !reflect.DeepEqual(*fc, flowcontrol.Config{}) {
			c.failAt(errs, "flow_control", "flow_control is set but not enabled (enabled: true), so nothing reads it")
		}
		if c.Trust.Objectives != "" && c.Trust.Objectives.valid() {
			c.failAt(errs, "", "trust.objectives is set but flow control is off, so nothing reads it")
		}
		c.objectives = nil
		return
	}
	problems := fc.Validate()
	for _, p := range problems {
		where := c.file()
		if n := config.NodeAt(c.at["flow_control:"], flowPath(p.Key)...); n != nil {
			where = fmt.Sprintf("%s:%d:%d", where, n.Line, n.Column)
		}
		*errs = append(*errs, fmt.Errorf("%s: %w: %w", where, policies.ErrConfig, p))
	}
	if len(problems) == 0 {
		c.loadObjectives(errs)
	}
}

// flowPath splits a flowcontrol.Problem key ("bands[1].min_priority")
// into config.NodeAt's path.
func flowPath(key string) []any {
	var out []any
	for part := range strings.SplitSeq(key, ".") {
		name, idx, ok := strings.Cut(part, "[")
		out = append(out, name)
		if i, err := strconv.Atoi(strings.TrimSuffix(idx, "]")); ok && err == nil {
			out = append(out, i)
		}
	}
	return out
}

// failAt appends an error of the configuration at the section key names
// (c.at; "" or unknown: the file alone): "file:line:column: invalid policy
// configuration: message".
func (c *Config) failAt(errs *[]error, key, format string, args ...any) {
	where := c.file()
	if n := c.at[key]; n != nil {
		where = fmt.Sprintf("%s:%d:%d", where, n.Line, n.Column)
	}
	*errs = append(*errs, fmt.Errorf("%s: %w: "+format, append([]any{where, policies.ErrConfig}, args...)...))
}

func (c *Config) buildChain(reg *policies.Registry) (*policies.Chain, error) {
	sections := make(map[string]policies.PoolSection, len(c.Pools))
	names := make([]string, 0, len(c.Pools))
	for _, p := range c.Pools {
		names = append(names, p.Name)
		if len(p.Policy) > 0 {
			sections[p.Name] = p.Policy
		}
	}
	// Policies that name pools (slo-grid, priority) refuse unknown names.
	return reg.Build(c.Chain, sections, policies.KnownPools(names...))
}

// loraOf returns the adapter name to hash model's blocks with: the model's
// own name when it is configured as a LoRA adapter, "" otherwise.
func (c *Config) loraOf(model string) string {
	for _, m := range c.Models {
		if m.Name == model && m.LoRAOf != "" {
			return model
		}
	}
	return ""
}

// TokenizerFor returns the tokenizer configuration the router uses for
// model (`kvgate tokenize --config`).
func (c *Config) TokenizerFor(model string) tokenizer.Config { return c.tokenizerFor(model) }

// maxBodyBytes returns model's body limit (0: none of its own).
func (c *Config) maxBodyBytes(model string) int {
	for _, m := range c.Models {
		if m.Name == model {
			return m.MaxBodyBytes
		}
	}
	return 0
}

// tokenizerFor returns the tokenizer configuration of model.
func (c *Config) tokenizerFor(model string) tokenizer.Config {
	for _, m := range c.Models {
		if m.Name == model {
			if m.Tokenizer.Backend == "" && m.LoRAOf != "" && m.LoRAOf != model {
				return c.tokenizerFor(m.LoRAOf) // an adapter tokenizes as its base
			}
			tc := m.Tokenizer
			tc.Model = model
			return tc
		}
	}
	tc := DefaultTokenizer
	tc.Model = model
	return tc
}

func sameTokenizer(a, b tokenizer.Config) bool {
	a.Logger, b.Logger, a.Registerer, b.Registerer, a.HTTPClient, b.HTTPClient = nil, nil, nil, nil, nil, nil
	return reflect.DeepEqual(a, b)
}

// fileConfig is Config as it is read, the pools left for pool.DecodeConfigs.
type fileConfig struct {
	Probe   ProbeConfig     `yaml:"probe"`
	Trust   TrustConfig     `yaml:"trust"`
	Tenancy TenancyConfig   `yaml:"tenancy"`
	Chain   []policies.Spec `yaml:"chain"`
	Models  []ModelConfig   `yaml:"models"`
	Pools   yaml.Node       `yaml:"pools"`
	Shadow  *ShadowConfig   `yaml:"shadow"`
	// FlowControl is flow_control.
	FlowControl flowcontrol.Config `yaml:"flow_control"`
}

// LoadConfig reads, decodes strictly and validates a configuration file,
// with the policies of reg (nil: the built-ins). Policy files named by pools
// are read relative to it.
func LoadConfig(path string, reg *policies.Registry) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("globalrouter config: %w", err)
	}
	return ParseConfig(path, data, reg)
}

// ParseConfig is LoadConfig of data read from file.
func ParseConfig(file string, data []byte, reg *policies.Registry) (*Config, error) {
	c, err := parseConfig(file, data)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(reg); err != nil {
		return nil, err
	}
	return c, nil
}

// readConfig is LoadConfig without the validation (Reload's to do).
func readConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("globalrouter config: %w", err)
	}
	return parseConfig(path, data)
}

// sections locates the top-level keys validate names: "probe" and
// "tenancy" (their keys)
// and each "models[i]" entry.
func sections(doc *yaml.Node) map[string]*yaml.Node {
	at := map[string]*yaml.Node{}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return at
	}
	top := doc.Content[0].Content
	for i := 0; i+1 < len(top); i += 2 {
		switch k, v := top[i], top[i+1]; k.Value {
		case "probe", "tenancy":
			at[k.Value] = k
		case "flow_control":
			at["flow_control"], at["flow_control:"] = k, v
		case "models":
			for j, m := range v.Content {
				at[fmt.Sprintf("models[%d]", j)] = m
			}
		}
	}
	return at
}

// parseConfig decodes data strictly and applies the defaults.
func parseConfig(file string, data []byte) (*Config, error) {
	doc, err := config.ParseFile(file, data)
	if err != nil {
		return nil, err
	}
	var fc fileConfig
	// Both decoded before either error returns: one run reports the
	// unknown fields at the top and every pool's errors.
	top := config.DecodeStrict(file, "", doc, &fc)
	pools, err := pool.DecodeConfigs(file, &fc.Pools)
	if top != nil || err != nil {
		if top == nil || err == nil {
			return nil, cmp.Or(top, err)
		}
		return nil, errors.Join(top, err)
	}
	c := &Config{Probe: fc.Probe, Trust: fc.Trust, Tenancy: fc.Tenancy, Chain: fc.Chain, Models: fc.Models, Pools: pools, Shadow: fc.Shadow, FlowControl: fc.FlowControl, File: file, sum: watchSum(file, data), at: sections(doc)}
	if c.Shadow != nil {
		c.Shadow.setFile(file)
	}
	if p := &c.FlowControl.ObjectivesFile; *p != "" && !filepath.IsAbs(*p) {
		*p = filepath.Join(filepath.Dir(file), *p)
	}
	for i := range c.Chain {
		c.Chain[i].Args.File = file
	}
	for i := range c.Models {
		tc := &c.Models[i].Tokenizer
		for _, p := range []*string{&tc.Path, &tc.ChatTemplate} {
			if *p != "" && !filepath.IsAbs(*p) {
				*p = filepath.Join(filepath.Dir(file), *p)
			}
		}
	}
	c.Defaults()
	return c, nil
}
