// Package timing is the engine timing model shared by the mock engine
// (mocker.DefaultTiming) and the local router's ttft scorer
// (localrouter/scorer_ttft.go), which reads the same curves scaled to an
// operator's measurements: the milliseconds of one iteration's prefill of n
// new tokens and of one decode step at a KV usage. It is a
// leaf: it imports nothing of kvgate, so the router does not depend on the
// mock engine.
package timing

import "math"

// The curves' coefficients: prefill ms = PrefillQuad·t² + PrefillLinear·t +
// PrefillFixed for t new tokens; decode ms = DecodeQuad·p² +
// DecodeLinear·p + DecodeFixed at KV usage p.
const (
	PrefillQuad   = 4.21e-7
	PrefillLinear = 0.01518
	PrefillFixed  = 16.5
	DecodeQuad    = -25.74
	DecodeLinear  = 54.01
	DecodeFixed   = 5.74
)

// PrefillMillis is the prefill part of an iteration computing newTokens
// new tokens, in milliseconds (0 for none).
func PrefillMillis(newTokens int) float64 {
	if newTokens <= 0 {
		return 0
	}
	t := float64(newTokens)
	return PrefillQuad*t*t + PrefillLinear*t + PrefillFixed
}

// DecodeMillis is the decode part of an iteration at kvUsage (clamped to
// 0..1), in milliseconds.
func DecodeMillis(kvUsage float64) float64 {
	p := math.Min(math.Max(kvUsage, 0), 1)
	return DecodeQuad*p*p + DecodeLinear*p + DecodeFixed
}
