package policies

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/lib/config"
)

// NameSLOGrid is the slo-grid policy's name.
const NameSLOGrid = "slo-grid"

var _ Policy = (*SLOGrid)(nil)

// SLOGrid is Dynamo's Global Router pool grid: the request's prompt length
// and its TTFT target select a cell of the prefill grid, its context length
// (the prompt length, as Dynamo's router uses at routing time) and its ITL
// target a cell of the decode grid. Prefill pools in the prefill cell, and
// decode or aggregated pools in the decode cell, rank first; the others keep
// their order behind them as fallbacks, or are dropped with strict: true (a
// role without a grid is never dropped). Within a cell the order the chain
// had is kept, so an earlier scorer (cost, kv-overlap) picks among the
// cell's pools. Scorer (filter with strict); chain arguments only:
//
//	prefill: {isl_buckets: [1024, 8192], ttft_ms_buckets: [200, 1000], pools: [[...], [...], [...]]}
//	decode:  {context_length_buckets: [...], itl_ms_buckets: [...], pools: [[...]]}
//	default_ttft_ms: 500   # when the request sets no x-kvgate-ttft-ms
//	default_itl_ms: 50     # when the request sets no x-kvgate-itl-ms
//	strict: false
//
// Buckets are increasing thresholds: a value below the first falls in row
// (column) 0, a value at or above threshold i and below threshold i+1 in
// row i+1 — Dynamo's floor((value - min) / step) with explicit edges.
// pools[row][column] is one pool name or a list of them. A request with no
// target and no default falls in the middle column (Dynamo uses the middle
// of the target range).
type SLOGrid struct {
	prefill, decode *grid
	strict          bool
}

// SLOGridArgs are slo-grid's chain arguments.
type SLOGridArgs struct {
	Prefill *PrefillGrid `yaml:"prefill"`
	Decode  *DecodeGrid  `yaml:"decode"`
	// DefaultTTFTMs and DefaultITLMs are the targets of requests that set
	// none (0: the middle column).
	DefaultTTFTMs float64 `yaml:"default_ttft_ms"`
	DefaultITLMs  float64 `yaml:"default_itl_ms"`
	// Strict drops the pools outside the selected cells.
	Strict bool `yaml:"strict"`
}

// PrefillGrid maps (ISL, TTFT target) to prefill pools: Pools has
// len(ISLBuckets)+1 rows of len(TTFTMsBuckets)+1 cells.
type PrefillGrid struct {
	ISLBuckets    []int     `yaml:"isl_buckets"`
	TTFTMsBuckets []float64 `yaml:"ttft_ms_buckets"`
	Pools         [][]Cell  `yaml:"pools"`
}

// DecodeGrid maps (context length, ITL target) to decode pools: Pools has
// len(ContextLengthBuckets)+1 rows of len(ITLMsBuckets)+1 cells.
type DecodeGrid struct {
	ContextLengthBuckets []int     `yaml:"context_length_buckets"`
	ITLMsBuckets         []float64 `yaml:"itl_ms_buckets"`
	Pools                [][]Cell  `yaml:"pools"`
}

// Cell is one grid cell's pools: in YAML a pool name or a list of names.
type Cell []string

// UnmarshalYAML implements yaml.Unmarshaler.
func (c *Cell) UnmarshalYAML(n *yaml.Node) error {
	n = config.Deref(n)
	switch {
	case n == nil:
		return config.Errorf("", nil, "cell", "empty cell")
	case n.Kind == yaml.ScalarNode && n.Tag != "!!null":
		*c = Cell{n.Value}
		return nil
	case n.Kind == yaml.SequenceNode:
		out := make(Cell, 0, len(n.Content))
		for _, e := range n.Content {
			if e = config.Deref(e); e == nil || e.Kind != yaml.ScalarNode || e.Tag == "!!null" {
				return config.Errorf("", n, "cell", "a cell lists pool names")
			}
			out = append(out, e.Value)
		}
		*c = out
		return nil
	default:
		return config.Errorf("", n, "cell", "a cell is a pool name or a list of pool names")
	}
}

// grid is a validated grid: rows by length thresholds, columns by target
// thresholds in milliseconds.
type grid struct {
	rows      []int
	cols      []float64
	cells     [][]Cell
	defaultMs float64
}

// cell returns the pools of the cell for length and target (0: none).
func (g *grid) cell(length int, target time.Duration) Cell {
	ms := float64(target) / float64(time.Millisecond)
	if target <= 0 {
		ms = g.defaultMs
	}
	r := sort.Search(len(g.rows), func(i int) bool { return g.rows[i] > length })
	var c int
	if ms > 0 {
		c = sort.Search(len(g.cols), func(i int) bool { return g.cols[i] > ms })
	} else {
		c = (len(g.cols) + 1) / 2
	}
	return g.cells[r][c]
}

func newSLOGrid(a Args) (Policy, error) {
	what := fmt.Sprintf("policy %q", a.Policy)
	var args SLOGridArgs
	if err := a.DecodeChain(&args); err != nil {
		return nil, err
	}
	if _, err := DecodePools(a, struct{}{}); err != nil {
		return nil, err
	}
	root := a.Chain.Node
	if args.Prefill == nil && args.Decode == nil {
		return nil, config.Errorf(a.Chain.File, root, what, "at least one of prefill, decode required")
	}
	for _, d := range []struct {
		field string
		v     float64
	}{{"default_ttft_ms", args.DefaultTTFTMs}, {"default_itl_ms", args.DefaultITLMs}} {
		if !(d.v >= 0) || d.v > maxMs {
			return nil, config.Errorf(a.Chain.File, config.NodeAt(root, d.field), what, "%s: got %v, want ≥ 0 and ≤ %v", d.field, d.v, maxMs)
		}
	}
	p := &SLOGrid{strict: args.Strict}
	var err error
	if g := args.Prefill; g != nil {
		if p.prefill, err = newGrid(a, what, "prefill", "isl_buckets", "ttft_ms_buckets", g.ISLBuckets, g.TTFTMsBuckets, g.Pools, args.DefaultTTFTMs); err != nil {
			return nil, err
		}
	}
	if g := args.Decode; g != nil {
		if p.decode, err = newGrid(a, what, "decode", "context_length_buckets", "itl_ms_buckets", g.ContextLengthBuckets, g.ITLMsBuckets, g.Pools, args.DefaultITLMs); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// maxMs bounds targets and thresholds (a day): larger values are typos.
const maxMs = 24 * 60 * 60 * 1000

func newGrid(a Args, what, name, rowField, colField string, rows []int, cols []float64, cells [][]Cell, defaultMs float64) (*grid, error) {
	at := func(path ...any) *yaml.Node { return config.NodeAt(a.Chain.Node, append([]any{name}, path...)...) }
	fail := func(n *yaml.Node, format string, args ...any) error {
		return config.Errorf(a.Chain.File, n, what, name+"."+format, args...)
	}
	for i, v := range rows {
		if v <= 0 || (i > 0 && v <= rows[i-1]) {
			return nil, fail(at(rowField, i), "%s[%d]: got %d, want positive and above the previous threshold (sorted, no duplicates)", rowField, i, v)
		}
	}
	for i, v := range cols {
		if !(v > 0) || v > maxMs || (i > 0 && v <= cols[i-1]) {
			return nil, fail(at(colField, i), "%s[%d]: got %v, want positive, ≤ %v and above the previous threshold (sorted, no duplicates)", colField, i, v, maxMs)
		}
	}
	if len(cells) != len(rows)+1 {
		return nil, fail(at("pools"), "pools: got %d rows, want %d (one more than %s)", len(cells), len(rows)+1, rowField)
	}
	for r, row := range cells {
		if len(row) != len(cols)+1 {
			return nil, fail(at("pools", r), "pools[%d]: got %d cells, want %d (one more than %s)", r, len(row), len(cols)+1, colField)
		}
		for c, cell := range row {
			if len(cell) == 0 {
				return nil, fail(at("pools", r, c), "pools[%d][%d]: empty cell, want at least one pool", r, c)
			}
			for i, pool := range cell {
				n := at("pools", r, c, i)
				if pool == "" {
					return nil, fail(n, "pools[%d][%d]: empty pool name", r, c)
				}
				if slices.Contains(cell[:i], pool) {
					return nil, fail(n, "pools[%d][%d]: pool %q listed twice", r, c, pool)
				}
				if err := a.CheckPool(n, fmt.Sprintf("%s: %s.pools[%d][%d]", what, name, r, c), pool); err != nil {
					return nil, err
				}
			}
		}
	}
	return &grid{rows: slices.Clone(rows), cols: slices.Clone(cols), cells: cells, defaultMs: defaultMs}, nil
}

// NewSLOGrid returns an slo-grid policy for chains built in Go; it
// validates args as the YAML configuration is.
func NewSLOGrid(args SLOGridArgs) (*SLOGrid, error) {
	p, err := newSLOGrid(Args{Policy: NameSLOGrid, Chain: SectionOf(args)})
	if err != nil {
		return nil, err
	}
	return p.(*SLOGrid), nil
}

// Name implements Policy.
func (*SLOGrid) Name() string { return NameSLOGrid }

// Cells returns the pools of the prefill and decode cells req falls in (nil
// for a grid not configured), for explanations and tests.
func (g *SLOGrid) Cells(req *Request) (prefill, decode []string) {
	if g.prefill != nil {
		prefill = g.prefill.cell(req.ISL, req.SLO.TTFT)
	}
	if g.decode != nil {
		decode = g.decode.cell(req.ISL, req.SLO.ITL)
	}
	return prefill, decode
}

// Rank implements Policy.
func (g *SLOGrid) Rank(req *Request, cands []Candidate) ([]Candidate, error) {
	prefill, decode := g.Cells(req)
	// rank: 0 in its role's cell, 1 outside it, 2 outside and dropped
	// when strict (a role without a grid is never outside).
	rank := func(c Candidate) int {
		cell := decode
		if c.Role == RolePrefill {
			cell = prefill
		}
		switch {
		case cell == nil:
			return 1
		case slices.Contains(cell, c.Pool):
			return 0
		default:
			return 2
		}
	}
	if g.strict {
		cands = slices.DeleteFunc(cands, func(c Candidate) bool { return rank(c) == 2 })
	}
	slices.SortStableFunc(cands, func(a, b Candidate) int { return cmp.Compare(min(rank(a), 1), min(rank(b), 1)) })
	return cands, nil
}
