package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/policies"
)

// Sweep parameters of the local routers (every pool's, in a config
// replay). A config replay also sweeps any chain argument by its path:
// chain.POLICY.KEY[.KEY...] (e.g. chain.disaggregate.threshold_tokens).
const (
	SweepCredit       = "credit"        // overlap_score_credit
	SweepScale        = "scale"         // prefill_load_scale
	SweepTemperature  = "temp"          // router_temperature
	SweepPredictedTTL = "predicted_ttl" // the routers' predicted-entry TTL (0: none)
)

// sweepAliases are the router parameters' configuration names.
var sweepAliases = map[string]string{
	"overlap_score_credit": SweepCredit,
	"prefill_load_scale":   SweepScale,
	"router_temperature":   SweepTemperature,
	"temperature":          SweepTemperature,
}

// SweepParam is one swept parameter and the values it takes.
type SweepParam struct {
	Name   string   `json:"name"`
	Values []string `json:"values"`
}

// chainPath reports whether p names a chain argument, and its parts.
func (p SweepParam) chainPath() (policy string, keys []string, ok bool) {
	rest, ok := strings.CutPrefix(p.Name, "chain.")
	if !ok {
		return "", nil, false
	}
	parts := strings.Split(rest, ".")
	return parts[0], parts[1:], true
}

// ParseSweep parses "name=v1,v2,...;name=..." (e.g.
// "credit=1,2,4,8;scale=1,4,8"). Names: credit (overlap_score_credit),
// scale (prefill_load_scale), temp (router_temperature), predicted_ttl (a
// duration; 0 for none), and chain.POLICY.KEY paths (config replays).
// Numbers must be non-negative. Errors name the part at fault.
func ParseSweep(s string) ([]SweepParam, error) {
	var out []SweepParam
	for i, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, vals, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if a, isAlias := sweepAliases[name]; isAlias {
			name = a
		}
		if !ok || name == "" {
			return nil, fmt.Errorf("%w: sweep part %d %q: want name=value,value,…", ErrConfig, i+1, part)
		}
		p := SweepParam{Name: name}
		for v := range strings.SplitSeq(vals, ",") {
			v = strings.TrimSpace(v)
			if v == "" {
				return nil, fmt.Errorf("%w: sweep part %d %q: empty value", ErrConfig, i+1, part)
			}
			if err := checkSweepValue(name, v); err != nil {
				return nil, fmt.Errorf("%w: sweep part %d %q: %v", ErrConfig, i+1, part, err)
			}
			if slices.Contains(p.Values, v) {
				return nil, fmt.Errorf("%w: sweep part %d %q: value %q listed twice", ErrConfig, i+1, part, v)
			}
			p.Values = append(p.Values, v)
		}
		if slices.ContainsFunc(out, func(q SweepParam) bool { return q.Name == name }) {
			return nil, fmt.Errorf("%w: sweep part %d %q: parameter %q swept twice", ErrConfig, i+1, part, name)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: sweep %q names no parameter", ErrConfig, s)
	}
	n := 1
	for _, p := range out {
		n *= len(p.Values)
		if n > maxSweepPoints {
			return nil, fmt.Errorf("%w: sweep %q has more than %d combinations", ErrConfig, s, maxSweepPoints)
		}
	}
	return out, nil
}

// maxSweepPoints bounds a sweep's combinations.
const maxSweepPoints = 1024

func checkSweepValue(name, v string) error {
	switch name {
	case SweepCredit, SweepScale, SweepTemperature:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0) || f > 1e9 {
			return fmt.Errorf("%s value %q is not a non-negative number", name, v)
		}
	case SweepPredictedTTL:
		if v == "0" {
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%s value %q is not a duration ≥ 0 (e.g. 2s)", name, v)
		}
	default:
		pol, keys, ok := SweepParam{Name: name}.chainPath()
		if !ok {
			return fmt.Errorf("unknown parameter %q (want credit, scale, temp, predicted_ttl or chain.POLICY.KEY)", name)
		}
		if pol == "" || len(keys) == 0 || slices.Contains(keys, "") {
			return fmt.Errorf("chain argument %q: want chain.POLICY.KEY[.KEY...]", name)
		}
	}
	return nil
}

// SweepPoint is one combination's outcome.
type SweepPoint struct {
	// Params are the combination, in the sweep's order ("credit=2").
	Params   []string `json:"params"`
	Topology string   `json:"topology"`
	MeanTTFT float64  `json:"ttft_mean_ms"`
	P99TTFT  float64  `json:"ttft_p99_ms"`
	HitRatio float64  `json:"hit_ratio"`
	Rejected int      `json:"rejected"`
	// Pareto: no other point is at least as good on mean TTFT, p99 TTFT
	// and hit ratio and better on one.
	Pareto bool    `json:"pareto"`
	Result *Result `json:"result"`
}

// SweepReport is a Sweep's outcome.
type SweepReport struct {
	// Report is the first combination's report, its header the sweep's.
	Header *Report       `json:"header"`
	Params []SweepParam  `json:"params"`
	Points []*SweepPoint `json:"points"`
}

// Sweep runs cfg once per combination of params and marks the Pareto
// front of (mean TTFT, p99 TTFT) against hit ratio. Without cfg.Global
// every combination is one cost policy (Dynamo's defaults with the swept
// parameters) on each of cfg's topologies; with it, the configuration with
// the swept router parameters and chain arguments. cfg.Parallel
// combinations run at once.
func Sweep(ctx context.Context, cfg Config, params []SweepParam) (*SweepReport, error) {
	if len(params) == 0 {
		return nil, fmt.Errorf("%w: nothing to sweep", ErrConfig)
	}
	for _, p := range params {
		if _, _, ok := p.chainPath(); ok && cfg.Global == nil {
			return nil, fmt.Errorf("%w: sweeping %s needs a configuration (--config)", ErrConfig, p.Name)
		}
	}
	combos := combinations(params)
	cfgs := make([]Config, len(combos))
	for i, combo := range combos {
		c, err := sweepConfig(cfg, params, combo)
		if err != nil {
			return nil, err
		}
		cfgs[i] = c
	}
	par := max(cfg.Parallel, 1)
	reps := make([]*Report, len(cfgs))
	errs := make([]error, len(cfgs))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i := range cfgs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c := cfgs[i]
			c.Parallel = 1
			reps[i], errs[i] = Run(ctx, c)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := &SweepReport{Header: reps[0], Params: params}
	for i, rep := range reps {
		for _, r := range rep.Results {
			labels := make([]string, len(params))
			for j, p := range params {
				labels[j] = p.Name + "=" + combos[i][j]
			}
			out.Points = append(out.Points, &SweepPoint{Params: labels, Topology: r.Topology, MeanTTFT: r.TTFTMS.Mean, P99TTFT: r.TTFTMS.P99,
				HitRatio: r.HitRatio, Rejected: r.Rejected, Result: r})
		}
	}
	markPareto(out.Points)
	return out, nil
}

// combinations lists every combination of the parameters' values, the
// last parameter varying fastest.
func combinations(params []SweepParam) [][]string {
	out := [][]string{nil}
	for _, p := range params {
		var next [][]string
		for _, c := range out {
			for _, v := range p.Values {
				next = append(next, append(slices.Clone(c), v))
			}
		}
		out = next
	}
	return out
}

// sweepConfig is cfg with one combination applied.
func sweepConfig(cfg Config, params []SweepParam, combo []string) (Config, error) {
	base := Dynamo()
	var labels []string
	var chainSets []func(*globalrouter.Config) error
	for i, p := range params {
		v := combo[i]
		labels = append(labels, p.Name+"="+v)
		f, _ := strconv.ParseFloat(v, 64)
		switch p.Name {
		case SweepCredit:
			base.Credit = f
		case SweepScale:
			base.Scale = f
		case SweepTemperature:
			base.Temperature = f
		case SweepPredictedTTL:
			d, _ := time.ParseDuration(v) // "0" fails: zero
			if d == 0 {
				d = -1 // no predicted entries
			}
			cfg.PredictedTTL = d
		default:
			pol, keys, _ := p.chainPath()
			chainSets = append(chainSets, func(c *globalrouter.Config) error { return setChainArg(c, pol, keys, v) })
		}
	}
	label := strings.Join(labels, ",")
	if cfg.Global == nil {
		base.Name = label
		cfg.Policies = []Policy{base}
		return cfg, nil
	}
	g := *cfg.Global
	gc := *g.Config
	gc.Chain = slices.Clone(gc.Chain)
	for _, set := range chainSets {
		if err := set(&gc); err != nil {
			return cfg, err
		}
	}
	g.Config = &gc
	g.Label = label
	prev := g.Router
	g.Router = func(pool string, c *localrouter.Config) {
		c.OverlapScoreCredit, c.PrefillLoadScale, c.RouterTemperature = base.Credit, base.Scale, base.Temperature
		if prev != nil {
			prev(pool, c)
		}
	}
	cfg.Global = &g
	return cfg, nil
}

// setChainArg sets chain entry pol's argument at keys to value (a YAML
// scalar), on a copy of the entry's arguments.
func setChainArg(c *globalrouter.Config, pol string, keys []string, value string) error {
	i := slices.IndexFunc(c.Chain, func(s policies.Spec) bool { return s.Name == pol })
	if i < 0 {
		return fmt.Errorf("%w: sweep chain.%s.%s: the chain has no policy %q", ErrConfig, pol, strings.Join(keys, "."), pol)
	}
	s := c.Chain[i]
	root := &yaml.Node{Kind: yaml.MappingNode}
	if s.Args.Node != nil {
		if s.Args.Node.Kind != yaml.MappingNode {
			return fmt.Errorf("%w: sweep chain.%s: its arguments are not a mapping", ErrConfig, pol)
		}
		root = deepCopy(s.Args.Node)
	}
	n := root
	for j, k := range keys {
		var child *yaml.Node
		for m := 0; m+1 < len(n.Content); m += 2 {
			if n.Content[m].Value == k {
				child = n.Content[m+1]
			}
		}
		last := j == len(keys)-1
		if child == nil {
			child = &yaml.Node{Kind: yaml.MappingNode}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, child)
		}
		if last {
			*child = yaml.Node{Kind: yaml.ScalarNode, Value: value, Line: child.Line, Column: child.Column}
			break
		}
		if child.Kind != yaml.MappingNode {
			return fmt.Errorf("%w: sweep chain.%s.%s: %q is not a mapping", ErrConfig, pol, strings.Join(keys, "."), k)
		}
		n = child
	}
	s.Args.Node = root
	c.Chain[i] = s
	return nil
}

func deepCopy(n *yaml.Node) *yaml.Node {
	c := *n
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, k := range n.Content {
		c.Content[i] = deepCopy(k)
	}
	return &c
}

// markPareto marks the points no other point dominates (lower or equal
// mean and p99 TTFT, higher or equal hit ratio, one strictly better).
// Points with rejected requests are compared like the others: their TTFTs
// cover the requests served only, so they are flagged in the table.
func markPareto(pts []*SweepPoint) {
	for _, p := range pts {
		p.Pareto = true
		for _, q := range pts {
			if q != p && dominates(q, p) {
				p.Pareto = false
				break
			}
		}
	}
}

func dominates(a, b *SweepPoint) bool {
	if a.MeanTTFT > b.MeanTTFT || a.P99TTFT > b.P99TTFT || a.HitRatio < b.HitRatio {
		return false
	}
	return a.MeanTTFT < b.MeanTTFT || a.P99TTFT < b.P99TTFT || a.HitRatio > b.HitRatio
}

// WriteJSON writes the sweep as indented JSON.
func (s *SweepReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// WriteTable writes every point, the Pareto front's marked with '*', then
// the front alone sorted by p99 TTFT.
func (s *SweepReport) WriteTable(w io.Writer) error {
	h := s.Header
	fmt.Fprintf(w, "sweep over %s: trace %s, %d requests, rate %gx, %d workers, seed %d; oracle hit ratio %.3f, capacity oracle %.3f\n\n",
		sweepNames(s.Params), orDash(h.Trace), h.Requests, h.Rate, h.Workers, h.Seed, h.OracleHitRatio, h.CapacityOracleHitRatio)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pareto\ttopology\tparameters\tTTFT mean ms\tp99 ms\thit\trejected\t")
	for _, p := range s.Points {
		mark := ""
		if p.Pareto {
			mark = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.3f\t%d\t\n", mark, p.Topology, strings.Join(p.Params, ","), f0(p.MeanTTFT), f0(p.P99TTFT), p.HitRatio, p.Rejected)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	front := slices.DeleteFunc(slices.Clone(s.Points), func(p *SweepPoint) bool { return !p.Pareto })
	slices.SortStableFunc(front, func(a, b *SweepPoint) int {
		if a.P99TTFT != b.P99TTFT {
			if a.P99TTFT < b.P99TTFT {
				return -1
			}
			return 1
		}
		return 0
	})
	fmt.Fprintf(w, "\nPareto front (%d of %d points; no other has lower or equal mean and p99 TTFT and higher or equal hit ratio), by p99 TTFT:\n", len(front), len(s.Points))
	for _, p := range front {
		fmt.Fprintf(w, "  %s %s: TTFT mean %s p99 %s ms, hit %.3f", p.Topology, strings.Join(p.Params, ","), f0(p.MeanTTFT), f0(p.P99TTFT), p.HitRatio)
		if p.Rejected > 0 {
			fmt.Fprintf(w, " (%d rejected)", p.Rejected)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func sweepNames(ps []SweepParam) string {
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%s (%d values)", p.Name, len(p.Values)))
	}
	return strings.Join(s, " × ")
}
