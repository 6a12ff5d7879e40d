package sim

import (
	"strconv"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

// ttftChain is the local routers' worker chain under a KindTTFT policy:
// the saturation filter, then the local router's ttft scorer
// (localrouter/scorer_ttft.go) calibrated to the simulated engines (the
// mocker's timing divided by the speedup, their chunk and KV capacity),
// so that what the replay measures is the scorer a deployment runs.
// Several pools are ranked by the global router's cost policy on
// Selection.Cost, the ttft scorer's prediction in milliseconds.
func (p Policy) ttftChain(cfg Config) []localrouter.ScorerSpec {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	ext := "auto"
	if !p.ExtAuto {
		ext = f(p.Externality)
	}
	return []localrouter.ScorerSpec{
		{Name: "saturation"},
		{Name: "ttft", Weight: 1, Args: map[string]string{
			"ext":             ext,
			"chunk":           strconv.Itoa(cfg.MaxNumBatchedTokens),
			"prefill_ms":      f(mocker.PrefillMillis(cfg.MaxNumBatchedTokens) / cfg.Speedup),
			"decode_empty_ms": f(mocker.DecodeMillis(0) / cfg.Speedup),
			"decode_full_ms":  f(mocker.DecodeMillis(1) / cfg.Speedup),
			"kv_tokens":       strconv.Itoa(cfg.KVTokens),
		}},
	}
}
