package mocker

import (
	"time"

	"github.com/kvgate/kvgate/lib/timing"
)

// Batch is the shape of one engine iteration, what a Timing prices.
type Batch struct {
	// PrefillTokens is the number of prompt tokens computed in the iteration
	// (uncached tokens only: prefix hits cost nothing).
	PrefillTokens int
	// DecodeSeqs is the number of sequences that decode one token.
	DecodeSeqs int
	// KVUsage is the fraction of KV blocks in use, in [0, 1].
	KVUsage float64
}

// Timing prices an engine iteration. Implementations must be pure functions
// of the batch (the engine calls them once per iteration).
type Timing interface {
	IterationTime(b Batch) time.Duration
}

// DefaultTiming is the timing model fitted on a real GPU
// (Dynamo's mocker): prefill ms = 4.21e-7·t² + 0.01518·t + 16.5 for t new
// tokens; decode ms = −25.74p² + 54.01p + 5.74 at KV occupancy p. An
// iteration that both prefills and decodes costs the sum. Speedup (≥ 1 runs
// faster) divides the result; 0 means 1.
type DefaultTiming struct {
	Speedup float64
}

var _ Timing = DefaultTiming{}

// PrefillMillis is the prefill part of the model, in milliseconds
// (lib/timing, shared with the local router's ttft scorer).
func PrefillMillis(newTokens int) float64 { return timing.PrefillMillis(newTokens) }

// DecodeMillis is the decode part of the model, in milliseconds.
func DecodeMillis(kvUsage float64) float64 { return timing.DecodeMillis(kvUsage) }

// IterationTime implements Timing.
func (m DefaultTiming) IterationTime(b Batch) time.Duration {
	ms := PrefillMillis(b.PrefillTokens)
	if b.DecodeSeqs > 0 {
		ms += DecodeMillis(b.KVUsage)
	}
	s := m.Speedup
	if s <= 0 {
		s = 1
	}
	d := time.Duration(ms / s * float64(time.Millisecond))
	if d <= 0 {
		d = 1 // time always moves forward
	}
	return d
}
