package globalrouter

import (
	"fmt"
	"slices"
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
	writeWhy(&b, decidedBy(trace, initial, winner), trace, results, ranked, w.Pool)
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
		why = configOrder
	}
	return why
}

const (
	costPolicy  = "cost"
	configOrder = "configuration order (no policy reordered it)"
	// costWords is how an explanation names a probe's cost: its unit
	// and direction, in one place.
	costWords = "cost (predicted ms added, lower is better)"
)

// writeWhy writes why the winner pool won. A winner first in
// configuration order that a cost policy kept first, strictly cheaper than
// every other pool ranked, is credited to the cost; either way the costs
// are shown when they agree with the outcome.
func writeWhy(b *strings.Builder, why string, t *policies.Trace, results []probeResult, ranked []policies.Candidate, winner string) {
	if why == "" {
		return
	}
	against, cheapest := costComparison(results, ranked, winner)
	if why == configOrder && cheapest && slices.ContainsFunc(t.Steps, func(s policies.Step) bool { return s.Policy == costPolicy }) {
		why = costPolicy
	}
	switch {
	case why == costPolicy && against != "":
		fmt.Fprintf(b, ": ranked first by %s: %s", costWords, against)
	case why == configOrder && cheapest:
		fmt.Fprintf(b, ": ranked first by %s; %s %s", why, costWords, against)
	default:
		fmt.Fprintf(b, ": ranked first by %s", why)
	}
}

// costComparison renders the winner's probe cost against each other pool
// still ranked ("28.06 against pool-b 56.06"; "" when there is none) and
// whether the winner's is strictly the lowest.
func costComparison(results []probeResult, ranked []policies.Candidate, winner string) (string, bool) {
	cost := map[string]float64{}
	for _, res := range results {
		if res.err == nil {
			cost[res.pe.cfg.Name] = res.sel.Cost
		}
	}
	wc, ok := cost[winner]
	if !ok {
		return "", false
	}
	var others []string
	cheapest := true
	seen := map[string]bool{winner: true}
	for _, c := range ranked {
		oc, ok := cost[c.Pool]
		if seen[c.Pool] || !ok {
			continue
		}
		seen[c.Pool] = true
		cheapest = cheapest && wc < oc
		others = append(others, fmt.Sprintf("%s %.4g", c.Pool, oc))
	}
	if len(others) == 0 {
		return "", false
	}
	return fmt.Sprintf("%.4g against %s", wc, strings.Join(others, ", ")), cheapest
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
