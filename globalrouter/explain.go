package globalrouter

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
)

// explain says what each pool's probe answered and why the winner won: the
// chain's steps, and the last policy that put the winner first.
func explain(p *prepared, results []probeResult, ranked []policies.Candidate, trace *policies.Trace, refused []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model=%s isl=%d", p.req.Model, len(p.tokens))
	b.WriteString("; probes (cost: the predicted ms the request adds, lower wins):")
	for _, res := range results {
		fmt.Fprintf(&b, " %s", res.pe.cfg.Name)
		if res.err != nil {
			fmt.Fprintf(&b, " skipped (%v);", res.err)
			continue
		}
		s := res.sel
		fmt.Fprintf(&b, " %s/%d@%s overlap %d/%d blocks of %d, uncached %d tokens, cost %.4g ms (%s, %d workers);",
			s.WorkerID, s.DPRank, s.Address, s.OverlapBlocks, s.RequestBlocks, res.pe.cfg.BlockSize,
			s.UncachedTokens(), s.Cost, res.dur.Round(1000), s.Candidates)
	}
	fmt.Fprintf(&b, " chain: %s", trace.String())
	w := ranked[0]
	winner := w.Pool
	if w.Prefill != nil {
		winner += "+" + w.Prefill.Pool
	}
	fmt.Fprintf(&b, "; winner %s (worker %s)", winner, w.Probe.WorkerID)
	if sc := formatScores(w.Probe.Scores); sc != "" {
		fmt.Fprintf(&b, " scores=%s", sc)
	}
	initial := ""
	for _, res := range results {
		if res.err == nil {
			initial = res.pe.cfg.Name
			break
		}
	}
	if why := decidedBy(trace, initial, winner); why != "" {
		fmt.Fprintf(&b, ": ranked first by %s", why)
	}
	if w.Prefill != nil {
		fmt.Fprintf(&b, ", prefill on %s/%s (uncached %d tokens)", w.Prefill.Pool, w.Prefill.Probe.WorkerID, w.Probe.UncachedTokens())
	}
	if w.Disaggregation != "" {
		fmt.Fprintf(&b, "; disaggregation: %s", w.Disaggregation)
	}
	if len(refused) > 0 {
		fmt.Fprintf(&b, "; refused commits: %s", strings.Join(refused, "; "))
	}
	return b.String()
}

// decidedBy names the policy after which winner stayed first: the last
// step whose answer did not already start with it one step before.
func decidedBy(t *policies.Trace, initial, winner string) string {
	why := ""
	prev := initial
	for _, s := range t.Steps {
		first := ""
		if len(s.Pools) > 0 {
			first = s.Pools[0]
		}
		if first == winner && prev != winner {
			why = s.Policy
		}
		prev = first
	}
	if why == "" && len(t.Steps) > 0 {
		why = "configuration order (no policy reordered it)"
	}
	return why
}

// formatScores writes a worker's chain scores as name:contribution,...
// (contribution = weight × raw value, one decimal at least, 4 significant
// digits), "" for none (the pool's default chain: its one term is the
// cost the probe line shows).
func formatScores(scores []routing.Score) string {
	var b strings.Builder
	for i, s := range scores {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.Name)
		b.WriteByte(':')
		v := strconv.FormatFloat(s.Contribution, 'g', 4, 64)
		if !strings.ContainsAny(v, ".eEn") { // 412 → 412.0; NaN/Inf as is
			v += ".0"
		}
		b.WriteString(v)
	}
	return b.String()
}
