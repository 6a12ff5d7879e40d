package sim

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/sfnt"
	"golang.org/x/image/math/fixed"
)

// A plot is laid out once, as a figure of marks in pixel coordinates
// (Report.layout), and drawn by one of two renderers: SVG text
// (plot_svg.go) or a PNG raster (plot_png.go). The renderers place what
// they are given and make no layout decisions, so both formats show the
// same picture.

// PlotFormat is an output format of a plot.
type PlotFormat string

// Plot formats.
const (
	PlotSVG PlotFormat = "svg"
	PlotPNG PlotFormat = "png"
)

// PlotFormatOf returns the format a plot file's extension asks for (.svg or
// .png, in any case). Any other extension is an error naming it.
func PlotFormatOf(path string) (PlotFormat, error) {
	switch ext := filepath.Ext(path); strings.ToLower(ext) {
	case ".svg":
		return PlotSVG, nil
	case ".png":
		return PlotPNG, nil
	case "":
		return "", fmt.Errorf("%s: no file extension: want .svg or .png", path)
	default:
		return "", fmt.Errorf("%s: unknown plot file extension %q: want .svg or .png", path, ext)
	}
}

// WritePlot draws the report in the given format (WriteSVG, WritePNG).
func (rep *Report) WritePlot(w io.Writer, f PlotFormat) error {
	switch f {
	case PlotSVG:
		return rep.WriteSVG(w)
	case PlotPNG:
		return rep.WritePNG(w)
	default:
		return fmt.Errorf("plot format %q: want %q or %q", f, PlotSVG, PlotPNG)
	}
}

// palette is colour-blind friendly (Okabe–Ito): one colour per policy.
var palette = []color.RGBA{
	{0xE6, 0x9F, 0x00, 0xFF}, {0x56, 0xB4, 0xE9, 0xFF}, {0x00, 0x9E, 0x73, 0xFF}, {0xD5, 0x5E, 0x00, 0xFF},
	{0x00, 0x72, 0xB2, 0xFF}, {0xCC, 0x79, 0xA7, 0xFF}, {0xF0, 0xE4, 0x42, 0xFF}, {0x00, 0x00, 0x00, 0xFF},
}

// dashes tell topologies apart: one dash pattern per topology.
var dashes = [][]float64{nil, {8, 4}, {2, 3}, {12, 3, 2, 3}}

var (
	black    = color.RGBA{0, 0, 0, 0xFF}
	white    = color.RGBA{0xFF, 0xFF, 0xFF, 0xFF}
	frameCol = color.RGBA{0x88, 0x88, 0x88, 0xFF}
	gridCol  = color.RGBA{0xDD, 0xDD, 0xDD, 0xFF}
	minorCol = color.RGBA{0xEE, 0xEE, 0xEE, 0xFF}
	noteCol  = color.RGBA{0x55, 0x55, 0x55, 0xFF}
)

// seriesStyle returns the colour and dash pattern of each result: colour by
// policy, dash by topology, so a policy reads the same in every topology.
func (rep *Report) seriesStyle() (colours []color.RGBA, dash [][]float64, multiTopo bool) {
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

// figure is a laid-out plot: a canvas and the marks on it, in drawing
// order, in pixels with y down.
type figure struct {
	W, H  float64
	Marks []mark
	// CDF and Bars are the two plot areas, for tests.
	CDF, Bars box
}

type box struct{ X, Y, W, H float64 }

type point struct{ X, Y float64 }

// mark is a path, a rect or a text.
type mark interface{ isMark() }

// path is an open polyline stroked with a colour, a width and an optional
// dash pattern.
type path struct {
	Pts    []point
	Stroke color.RGBA
	Width  float64
	Dash   []float64
}

// rect is a filled and/or stroked rectangle; a zero alpha means none.
type rect struct {
	box
	Fill, Stroke color.RGBA
}

type anchor int

const (
	anchorStart anchor = iota
	anchorMiddle
	anchorEnd
)

// text is one line of text: X, Y is its baseline point at Anchor, and
// Rotate (degrees, clockwise) turns it about that point.
type text struct {
	X, Y   float64
	S      string
	Size   float64
	Bold   bool
	Fill   color.RGBA
	Anchor anchor
	Rotate float64
}

func (path) isMark() {}
func (rect) isMark() {}
func (text) isMark() {}

// Font sizes, in pixels.
const (
	titleSize = 16
	labelSize = 13
	smallSize = 11
)

// layout lays the report out: a title; on the left each result's TTFT CDF
// on a log time axis; beside it the legend (colour, name, p99 TTFT) that
// also keys the bars; on the right each result's hit ratio as a bar, with
// the oracle as a dashed line.
func (rep *Report) layout() *figure {
	colours, dash, multiTopo := rep.seriesStyle()
	n := len(rep.Results)
	const (
		left, top  = 70.0, 64.0
		cdfW       = 540.0
		gap        = 24.0
		legendRowH = 20.0
		barSlotMin = 34.0
	)
	plotH := max(360, legendRowH*float64(n+3))

	// Legend rows, measured so the column fits the longest.
	type row struct {
		name, value string
		col         color.RGBA
		dash        []float64
		dotted      bool
	}
	// One name per result: the policy, with its topology when there are
	// several.
	var names []string
	for _, r := range rep.Results {
		l := r.Policy
		if multiTopo {
			l = r.Label()
		}
		names = append(names, l)
	}
	var rows []row
	for i, r := range rep.Results {
		rows = append(rows, row{name: names[i], value: msLabel(r.TTFTMS.P99), col: colours[i], dash: dash[i]})
	}
	if rep.UnloadedTTFTMS.P50 > 0 {
		rows = append(rows, row{name: "unloaded p50", value: msLabel(rep.UnloadedTTFTMS.P50), col: noteCol, dash: []float64{1, 2.5}, dotted: true})
	}
	nameW, valueW := 0.0, textWidth("p99 TTFT", smallSize)
	for _, r := range rows {
		nameW = max(nameW, textWidth(r.name, smallSize))
		valueW = max(valueW, textWidth(r.value, smallSize))
	}
	legendW := max(30+nameW+16+valueW, textWidth("policy", labelSize)+16+valueW)

	// Bars stand in groups, one per run of results of a topology, half a
	// slot apart; each bar is labelled with its policy, turned when the
	// labels do not fit, and each group with its topology below.
	type group struct {
		name        string
		first, last int
	}
	var groups []group
	pos := make([]float64, n) // in slots, gaps included
	longest := 0.0
	for i, r := range rep.Results {
		if i == 0 || r.Topology != rep.Results[i-1].Topology {
			groups = append(groups, group{name: r.Topology, first: i})
			if i > 0 {
				pos[i] = 0.5
			}
		}
		groups[len(groups)-1].last = i
		if i > 0 {
			pos[i] += pos[i-1] + 1
		}
		longest = max(longest, textWidth(r.Policy, smallSize))
	}
	slots := 1.0
	if n > 0 {
		slots = pos[n-1] + 1
	}
	barW := max(300, barSlotMin*slots)
	slot := barW / slots
	turn := 0.0
	labelDrop := smallSize + 8.0
	if longest > slot-4 {
		turn = -50
		labelDrop = longest*math.Sin(50*math.Pi/180) + 16
	}
	if multiTopo {
		labelDrop += labelSize + 8
	}

	cdf := box{left, top, cdfW, plotH}
	legend := box{cdf.X + cdf.W + gap, top, legendW, plotH}
	bars := box{legend.X + legend.W + gap + 40, top, barW, plotH}
	f := &figure{
		W:   math.Ceil(bars.X + bars.W + 16 + textWidth("oracle", smallSize)),
		H:   math.Ceil(top + plotH + max(48, labelDrop+12)),
		CDF: cdf, Bars: bars,
	}
	add := func(m ...mark) { f.Marks = append(f.Marks, m...) }
	add(rect{box: box{0, 0, f.W, f.H}, Fill: white})
	add(text{X: left, Y: 26, S: fmt.Sprintf("%s: %d requests, rate %gx, %d workers", orDash(rep.Trace), rep.Requests, rep.Rate, rep.Workers), Size: titleSize, Bold: true, Fill: black})

	// TTFT CDF, x = log10(ms) over whole decades covering every result.
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
		return cdf.X + (math.Log10(max(msv, 1))-d0)/(d1-d0)*cdf.W
	}
	yOf := func(frac float64) float64 { return cdf.Y + cdf.H - frac*cdf.H }
	add(text{X: cdf.X + cdf.W/2, Y: cdf.Y - 10, S: "TTFT CDF", Size: labelSize, Bold: true, Fill: black, Anchor: anchorMiddle})
	// Minor ticks at 2× and 5× each decade, labelled when the decades are
	// few and wide.
	for d := d0; d < d1; d++ {
		for _, m := range []float64{2, 5} {
			x := xOf(m * math.Pow(10, d))
			add(path{Pts: []point{{x, cdf.Y}, {x, cdf.Y + cdf.H}}, Stroke: minorCol, Width: 1})
			add(path{Pts: []point{{x, cdf.Y + cdf.H}, {x, cdf.Y + cdf.H + 3}}, Stroke: frameCol, Width: 1})
			if d1-d0 <= 2 {
				add(text{X: x, Y: cdf.Y + cdf.H + 18, S: msLabel(m * math.Pow(10, d)), Size: smallSize, Fill: noteCol, Anchor: anchorMiddle})
			}
		}
	}
	for d := d0; d <= d1; d++ {
		x := xOf(math.Pow(10, d))
		add(path{Pts: []point{{x, cdf.Y}, {x, cdf.Y + cdf.H}}, Stroke: gridCol, Width: 1})
		add(path{Pts: []point{{x, cdf.Y + cdf.H}, {x, cdf.Y + cdf.H + 5}}, Stroke: frameCol, Width: 1})
		add(text{X: x, Y: cdf.Y + cdf.H + 18, S: msLabel(math.Pow(10, d)), Size: smallSize, Fill: black, Anchor: anchorMiddle})
	}
	f.fracAxis(cdf, 1, 0.25)
	add(text{X: cdf.X + cdf.W/2, Y: cdf.Y + cdf.H + 38, S: "time to first token (log scale)", Size: labelSize, Fill: black, Anchor: anchorMiddle})
	add(text{X: 20, Y: cdf.Y + cdf.H/2, S: "fraction of requests", Size: labelSize, Fill: black, Anchor: anchorMiddle, Rotate: -90})
	if u := rep.UnloadedTTFTMS.P50; u > 0 {
		x := xOf(u)
		add(path{Pts: []point{{x, cdf.Y}, {x, cdf.Y + cdf.H}}, Stroke: noteCol, Width: 1.5, Dash: []float64{1, 2.5}})
	}
	for i, r := range rep.Results {
		n := len(r.ttfts)
		if n == 0 {
			continue
		}
		// Start on the axis, then at most ~600 points per curve.
		pts := []point{{xOf(r.ttfts[0]), yOf(0)}}
		stride := max(1, n/600)
		for j := 0; j < n; j += stride {
			pts = append(pts, point{xOf(r.ttfts[j]), yOf(float64(j+1) / float64(n))})
		}
		pts = append(pts, point{xOf(r.ttfts[n-1]), yOf(1)})
		add(path{Pts: pts, Stroke: colours[i], Width: 2, Dash: dash[i]})
	}
	add(rect{box: cdf, Stroke: frameCol})

	// Legend.
	add(text{X: legend.X, Y: legend.Y + 4, S: "policy", Size: labelSize, Bold: true, Fill: black})
	add(text{X: legend.X + legend.W, Y: legend.Y + 4, S: "p99 TTFT", Size: smallSize, Fill: noteCol, Anchor: anchorEnd})
	for i, r := range rows {
		y := legend.Y + 26 + legendRowH*float64(i)
		w := 3.0
		if r.dotted {
			w = 1.5
		}
		add(path{Pts: []point{{legend.X, y - 4}, {legend.X + 22, y - 4}}, Stroke: r.col, Width: w, Dash: r.dash})
		add(text{X: legend.X + 30, Y: y, S: r.name, Size: smallSize, Fill: black})
		add(text{X: legend.X + legend.W, Y: y, S: r.value, Size: smallSize, Fill: black, Anchor: anchorEnd})
	}

	// Hit ratio bars, with the oracle as a dashed line.
	add(text{X: bars.X + bars.W/2, Y: bars.Y - 10, S: fmt.Sprintf("prefix hit ratio (dashed: oracle %.3f; capacity oracle %.3f)", rep.OracleHitRatio, rep.CapacityOracleHitRatio), Size: labelSize, Bold: true, Fill: black, Anchor: anchorMiddle})
	// The axis ends at a round number above every bar and the oracle, so
	// small ratios are not flat lines at the bottom.
	hiRatio := rep.OracleHitRatio
	for _, r := range rep.Results {
		hiRatio = max(hiRatio, r.HitRatio)
	}
	ratioTop, ratioStep := ratioAxis(hiRatio * 1.1)
	hOf := func(v float64) float64 { return min(max(v, 0)/ratioTop, 1) * bars.H }
	f.fracAxis(bars, ratioTop, ratioStep)
	for i, r := range rep.Results {
		h := hOf(r.HitRatio)
		x := bars.X + slot*pos[i] + slot*0.15
		add(rect{box: box{x, bars.Y + bars.H - h, slot * 0.7, h}, Fill: colours[i]})
		add(text{X: x + slot*0.35, Y: bars.Y + bars.H - h - 4, S: fmt.Sprintf("%.3f", r.HitRatio), Size: min(smallSize, math.Floor(slot*0.35)), Fill: black, Anchor: anchorMiddle})
		lx := x + slot*0.35
		if turn != 0 {
			add(text{X: lx + 4, Y: bars.Y + bars.H + 14, S: r.Policy, Size: smallSize, Fill: black, Anchor: anchorEnd, Rotate: turn})
		} else {
			add(text{X: lx, Y: bars.Y + bars.H + 16, S: r.Policy, Size: smallSize, Fill: black, Anchor: anchorMiddle})
		}
	}
	if multiTopo {
		for _, g := range groups {
			x0, x1 := bars.X+slot*pos[g.first]+slot*0.15, bars.X+slot*pos[g.last]+slot*0.85
			y := bars.Y + bars.H + labelDrop
			add(path{Pts: []point{{x0, y - labelSize - 2}, {x1, y - labelSize - 2}}, Stroke: frameCol, Width: 1})
			add(text{X: (x0 + x1) / 2, Y: y, S: g.name, Size: labelSize, Bold: true, Fill: black, Anchor: anchorMiddle})
		}
	}
	oy := bars.Y + bars.H - hOf(rep.OracleHitRatio)
	add(path{Pts: []point{{bars.X, oy}, {bars.X + bars.W, oy}}, Stroke: black, Width: 1.5, Dash: []float64{6, 4}})
	add(rect{box: bars, Stroke: frameCol})
	// Named outside the panel, where no bar label can cover it.
	add(text{X: bars.X + bars.W + 6, Y: oy + 4, S: "oracle", Size: smallSize, Fill: black})
	return f
}

// ratioAxis returns the top and tick step of a 0-based ratio axis that
// reaches at least hi.
func ratioAxis(hi float64) (top, step float64) {
	for _, a := range [][2]float64{{0.05, 0.01}, {0.1, 0.02}, {0.2, 0.05}, {0.3, 0.05}, {0.4, 0.1}, {0.6, 0.1}, {0.8, 0.2}} {
		if hi <= a[0] {
			return a[0], a[1]
		}
	}
	return 1, 0.25
}

// fracAxis draws a y axis from 0 to top, ticked every step, with grid
// lines across b.
func (f *figure) fracAxis(b box, top, step float64) {
	for q := 0; float64(q)*step <= top*1.0001; q++ {
		frac := float64(q) * step
		y := b.Y + b.H - frac/top*b.H
		f.Marks = append(f.Marks,
			path{Pts: []point{{b.X, y}, {b.X + b.W, y}}, Stroke: gridCol, Width: 1},
			path{Pts: []point{{b.X - 5, y}, {b.X, y}}, Stroke: frameCol, Width: 1},
			text{X: b.X - 8, Y: y + 4, S: fmt.Sprintf("%.2f", frac), Size: smallSize, Fill: black, Anchor: anchorEnd})
	}
}

// regular is Go Regular, the PNG's font, parsed once; the layout measures
// text with it too.
var regular = sync.OnceValue(func() *sfnt.Font {
	f, err := sfnt.Parse(goregular.TTF)
	if err != nil {
		panic("sim: parsing the embedded Go Regular font: " + err.Error())
	}
	return f
})

// textWidth is the advance of s in Go Regular at size pixels.
func textWidth(s string, size float64) float64 {
	f := regular()
	var buf sfnt.Buffer
	ppem := fixed.Int26_6(size * 64)
	var w fixed.Int26_6
	for _, r := range s {
		g, err := f.GlyphIndex(&buf, r)
		if err != nil {
			continue
		}
		a, err := f.GlyphAdvance(&buf, g, ppem, 0)
		if err == nil {
			w += a
		}
	}
	return float64(w) / 64
}

func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", math.Round(v/100)/10)
	default:
		return fmt.Sprintf("%gms", math.Round(v))
	}
}
