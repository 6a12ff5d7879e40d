package mocker

import (
	"errors"
	"fmt"
	"math"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/lib/config"
)

// Poly2 is a quadratic c2·x² + c1·x + c0.
type Poly2 struct {
	Quadratic float64 `yaml:"quadratic" json:"quadratic"`
	Linear    float64 `yaml:"linear" json:"linear"`
	Constant  float64 `yaml:"constant" json:"constant"`
}

// At evaluates the polynomial at x.
func (p Poly2) At(x float64) float64 { return p.Quadratic*x*x + p.Linear*x + p.Constant }

// Curves is the timing model as data: an iteration prefilling t new tokens
// costs PrefillMS.At(t) milliseconds (0 for none), one that decodes costs
// DecodeMS.At(p) more at KV occupancy p, and the sum is divided by
// Speedup. DefaultCurves is DefaultTiming's model; a replay's
// --engine-timing file gives others (ParseCurves), so the simulated
// engines can run curves the router's scorer was not told.
type Curves struct {
	// PrefillMS is the prefill part's milliseconds against the new
	// (uncached) tokens computed in the iteration.
	PrefillMS Poly2 `yaml:"prefill_ms" json:"prefill_ms"`
	// DecodeMS is the decode part's milliseconds against the KV usage,
	// 0..1 (clamped).
	DecodeMS Poly2 `yaml:"decode_ms" json:"decode_ms"`
	// Speedup divides the result (≥ 1 runs faster; 0 means 1).
	Speedup float64 `yaml:"speedup" json:"speedup"`
}

var _ Timing = Curves{}

// DefaultCurves is DefaultTiming's model (lib/timing's curves) as Curves.
func DefaultCurves() Curves {
	return Curves{
		PrefillMS: Poly2{Quadratic: 4.21e-7, Linear: 0.01518, Constant: 16.5},
		DecodeMS:  Poly2{Quadratic: -25.74, Linear: 54.01, Constant: 5.74},
		Speedup:   1,
	}
}

// PrefillMillis is the prefill part for newTokens new tokens, before
// Speedup (0 for none).
func (c Curves) PrefillMillis(newTokens int) float64 {
	if newTokens <= 0 {
		return 0
	}
	return c.PrefillMS.At(float64(newTokens))
}

// DecodeMillis is the decode part at kvUsage (clamped to 0..1), before
// Speedup.
func (c Curves) DecodeMillis(kvUsage float64) float64 {
	return c.DecodeMS.At(math.Min(math.Max(kvUsage, 0), 1))
}

// IterationTime implements Timing.
func (c Curves) IterationTime(b Batch) time.Duration {
	ms := c.PrefillMillis(b.PrefillTokens)
	if b.DecodeSeqs > 0 {
		ms += c.DecodeMillis(b.KVUsage)
	}
	s := c.Speedup
	if s <= 0 {
		s = 1
	}
	d := time.Duration(ms / s * float64(time.Millisecond))
	if d <= 0 {
		d = 1 // time always moves forward
	}
	return d
}

// Validate reports the first reason c cannot price an engine's
// iterations of up to maxTokens new tokens: a coefficient that is not a
// finite number, a negative speedup, or a prefill or decode part that is
// not positive somewhere on its domain (1..maxTokens tokens, usage 0..1).
func (c Curves) Validate(maxTokens int) error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"prefill_ms.quadratic", c.PrefillMS.Quadratic}, {"prefill_ms.linear", c.PrefillMS.Linear}, {"prefill_ms.constant", c.PrefillMS.Constant},
		{"decode_ms.quadratic", c.DecodeMS.Quadratic}, {"decode_ms.linear", c.DecodeMS.Linear}, {"decode_ms.constant", c.DecodeMS.Constant},
		{"speedup", c.Speedup},
	} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%s %v is not a finite number", f.name, f.v)
		}
	}
	if c.Speedup < 0 {
		return fmt.Errorf("speedup %v must not be negative", c.Speedup)
	}
	maxTokens = max(maxTokens, 1)
	if x, v := minOn(c.PrefillMS, 1, float64(maxTokens)); !(v > 0) {
		return fmt.Errorf("prefill_ms is %.4g ms at %.0f new tokens: it must be positive for 1..%d tokens", v, x, maxTokens)
	}
	if x, v := minOn(c.DecodeMS, 0, 1); !(v > 0) {
		return fmt.Errorf("decode_ms is %.4g ms at KV usage %.3g: it must be positive for usage 0..1", v, x)
	}
	return nil
}

// minOn returns where on [lo, hi] p is smallest, and its value there: at
// an end, or at the vertex when it lies inside.
func minOn(p Poly2, lo, hi float64) (x, v float64) {
	x, v = lo, p.At(lo)
	if w := p.At(hi); w < v {
		x, v = hi, w
	}
	if p.Quadratic > 0 {
		if m := -p.Linear / (2 * p.Quadratic); m > lo && m < hi {
			if w := p.At(m); w < v {
				x, v = m, w
			}
		}
	}
	return x, v
}

// ErrCurves wraps every error of ParseCurves.
var ErrCurves = errors.New("invalid engine timing")

// ParseCurves reads a timing model from YAML or JSON (JSON is YAML): the
// fields of Curves, each optional, the rest DefaultCurves'. Unknown fields
// are refused; every error names file and line. maxTokens is the
// engines' batch budget, the prefill domain Validate checks.
//
//	prefill_ms: {quadratic: 8.42e-7, linear: 0.03036, constant: 33}
//	decode_ms: {quadratic: -25.74, linear: 54.01, constant: 5.74}
func ParseCurves(file string, data []byte, maxTokens int) (Curves, error) {
	c := DefaultCurves()
	doc, err := config.ParseFile(file, data)
	if err != nil {
		return c, fmt.Errorf("%w: %w", ErrCurves, err)
	}
	root := doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		root = doc.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return c, fmt.Errorf("%w: %w", ErrCurves, config.Errorf(file, root, "engine timing", "want a mapping of prefill_ms, decode_ms and speedup"))
	}
	if err := config.DecodeStrict(file, "engine timing", root, &c); err != nil {
		return c, fmt.Errorf("%w: %w", ErrCurves, err)
	}
	if err := c.Validate(maxTokens); err != nil {
		return c, fmt.Errorf("%w: %w", ErrCurves, config.Errorf(file, root, "engine timing", "%v", err))
	}
	return c, nil
}
