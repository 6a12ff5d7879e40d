package sim

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

// palette is colour-blind friendly (Okabe–Ito): one colour per policy.
var palette = []string{"#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442", "#000000"}

// dashes tell topologies apart: one dash pattern per topology.
var dashes = []string{"", "8 4", "2 3", "12 3 2 3"}

// seriesStyle returns the colour and dash pattern of each result: colour by
// policy, dash by topology, so a policy reads the same in every topology.
func (rep *Report) seriesStyle() (colours, dash []string, multiTopo bool) {
	pol, top := map[string]int{}, map[string]int{}
	for _, r := range rep.Results {
		if _, ok := pol[r.Policy]; !ok {
			pol[r.Policy] = len(pol)
		}
		if _, ok := top[r.Topology]; !ok {
			top[r.Topology] = len(top)
		}
		colours = append(colours, palette[pol[r.Policy]%len(palette)])
		dash = append(dash, dashes[top[r.Topology]%len(dashes)])
	}
	return colours, dash, len(top) > 1
}

// WriteSVG draws the report: on the left each result's TTFT CDF (log time
// axis), on the right each result's hit ratio as a bar with the oracle as
// a dashed line. Hand-written SVG, no dependencies.
func (rep *Report) WriteSVG(w io.Writer) error {
	bw := bufio.NewWriter(w)
	const (
		width, height        = 1100, 540
		cdfX, cdfY           = 70, 50
		cdfW, cdfH           = 560, 360
		barX, barY           = 730, 50
		barW, barH           = 340, 360
		legendX, legendY     = cdfX + 10, cdfY + 10
		fontSize, smallFontS = 13, 11
	)
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n", width, height, width, height, fontSize)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="24" font-size="15" font-weight="bold">%s: %d requests, rate %gx, %d workers</text>`+"\n",
		cdfX, esc(orDash(rep.Trace)), rep.Requests, rep.Rate, rep.Workers)

	// TTFT CDF, x = log10(ms) over decades covering every result.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rep.Results {
		if len(r.ttfts) > 0 {
			lo = min(lo, r.ttfts[0])
			hi = max(hi, r.ttfts[len(r.ttfts)-1])
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	d0 := math.Floor(math.Log10(max(lo, 1)))
	d1 := math.Ceil(math.Log10(max(hi, 10)))
	if d1 <= d0 {
		d1 = d0 + 1
	}
	xOf := func(msv float64) float64 {
		return cdfX + (math.Log10(max(msv, 1))-d0)/(d1-d0)*cdfW
	}
	yOf := func(f float64) float64 { return cdfY + cdfH - f*cdfH }
	p(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", cdfX, cdfY, cdfW, cdfH)
	for d := d0; d <= d1; d++ {
		x := xOf(math.Pow(10, d))
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, cdfY, x, cdfY+cdfH)
		p(`<text x="%.1f" y="%d" text-anchor="middle" font-size="%d">%s</text>`+"\n", x, cdfY+cdfH+16, smallFontS, msLabel(math.Pow(10, d)))
	}
	for f := 0.0; f <= 1.0001; f += 0.25 {
		y := yOf(f)
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", cdfX, y, cdfX+cdfW, y)
		p(`<text x="%d" y="%.1f" text-anchor="end" font-size="%d">%.2f</text>`+"\n", cdfX-6, y+4, smallFontS, f)
	}
	p(`<text x="%d" y="%d" text-anchor="middle">time to first token (log scale)</text>`+"\n", cdfX+cdfW/2, cdfY+cdfH+36)
	p(`<text x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">fraction of requests</text>`+"\n", cdfY+cdfH/2, cdfY+cdfH/2)
	colours, dash, multiTopo := rep.seriesStyle()
	for i, r := range rep.Results {
		col := colours[i]
		n := len(r.ttfts)
		if n == 0 {
			continue
		}
		p(`<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="`, col, dash[i])
		// At most ~600 points per curve keep the file small.
		stride := max(1, n/600)
		for j := 0; j < n; j += stride {
			p("%.1f,%.1f ", xOf(r.ttfts[j]), yOf(float64(j+1)/float64(n)))
		}
		p("%.1f,%.1f\"/>\n", xOf(r.ttfts[n-1]), yOf(1))
		ly := legendY + 16*i
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3" stroke-dasharray="%s"/>`, legendX, ly+6, legendX+16, ly+6, col, dash[i])
		p(`<text x="%d" y="%d" font-size="%d">%s (p99 %s)</text>`+"\n", legendX+20, ly+10, smallFontS, esc(r.Label()), msLabel(r.TTFTMS.P99))
	}
	p(`<text x="%d" y="%d" font-size="%d" fill="#555">unloaded p50 %s</text>`+"\n", cdfX+cdfW-150, cdfY+cdfH-10, smallFontS, msLabel(rep.UnloadedTTFTMS.P50))

	// Hit ratio bars, with the oracle as a dashed line.
	p(`<text x="%d" y="%d" text-anchor="middle">prefix hit ratio (dashed: oracle %.3f)</text>`+"\n", barX+barW/2, barY-8, rep.OracleHitRatio)
	p(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", barX, barY, barW, barH)
	for f := 0.0; f <= 1.0001; f += 0.25 {
		y := float64(barY+barH) - f*barH
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", barX, y, barX+barW, y)
		p(`<text x="%d" y="%.1f" text-anchor="end" font-size="%d">%.2f</text>`+"\n", barX-6, y+4, smallFontS, f)
	}
	if n := len(rep.Results); n > 0 {
		slot := float64(barW) / float64(n)
		for i, r := range rep.Results {
			h := r.HitRatio * barH
			x := float64(barX) + slot*float64(i) + slot*0.15
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, float64(barY+barH)-h, slot*0.7, h, colours[i])
			p(`<text x="%.1f" y="%.1f" text-anchor="middle" font-size="%d">%.2f</text>`+"\n", x+slot*0.35, float64(barY+barH)-h-4, min(smallFontS-1, int(slot*0.45)), r.HitRatio)
			label := r.Policy
			if multiTopo {
				label = r.Label()
			}
			lx, ly := x+slot*0.35, float64(barY+barH+12)
			p(`<text x="%.1f" y="%.1f" text-anchor="end" font-size="%d" transform="rotate(-50 %.1f %.1f)">%s</text>`+"\n", lx, ly, smallFontS-1, lx, ly, esc(label))
		}
	}
	oy := float64(barY+barH) - rep.OracleHitRatio*barH
	p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="black" stroke-dasharray="6 4" stroke-width="1.5"/>`+"\n", barX, oy, barX+barW, oy)
	p("</svg>\n")
	return bw.Flush()
}

func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", math.Round(v/100)/10)
	default:
		return fmt.Sprintf("%gms", math.Round(v))
	}
}

func esc(s string) string { return html.EscapeString(s) }
