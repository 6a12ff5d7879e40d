package sim

import (
	"bufio"
	"fmt"
	"html"
	"image/color"
	"io"
	"strings"
)

// WriteSVG draws the report (Report.layout) as hand-written SVG: on the
// left each result's TTFT CDF (log time axis), on the right each result's
// hit ratio as a bar with the oracle as a dashed line.
func (rep *Report) WriteSVG(w io.Writer) error {
	f := rep.layout()
	bw := bufio.NewWriter(w)
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="%d">`+"\n", f.W, f.H, f.W, f.H, labelSize)
	for _, m := range f.Marks {
		switch m := m.(type) {
		case rect:
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"`, m.X, m.Y, m.W, m.H, svgPaint(m.Fill))
			if m.Stroke.A != 0 {
				p(` stroke="%s"`, svgColour(m.Stroke))
			}
			p("/>\n")
		case path:
			style := fmt.Sprintf(`fill="none" stroke="%s" stroke-width="%g"`, svgColour(m.Stroke), m.Width)
			if len(m.Dash) > 0 {
				style += fmt.Sprintf(` stroke-dasharray="%s"`, strings.Trim(fmt.Sprint(m.Dash), "[]"))
			}
			if len(m.Pts) == 2 {
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" %s/>`+"\n", m.Pts[0].X, m.Pts[0].Y, m.Pts[1].X, m.Pts[1].Y, style)
				continue
			}
			p(`<polyline %s points="`, style)
			for i, pt := range m.Pts {
				if i > 0 {
					p(" ")
				}
				p("%.1f,%.1f", pt.X, pt.Y)
			}
			p("\"/>\n")
		case text:
			p(`<text x="%.1f" y="%.1f" font-size="%g"`, m.X, m.Y, m.Size)
			if m.Fill != black {
				p(` fill="%s"`, svgColour(m.Fill))
			}
			if m.Bold {
				p(` font-weight="bold"`)
			}
			switch m.Anchor {
			case anchorMiddle:
				p(` text-anchor="middle"`)
			case anchorEnd:
				p(` text-anchor="end"`)
			}
			if m.Rotate != 0 {
				p(` transform="rotate(%g %.1f %.1f)"`, m.Rotate, m.X, m.Y)
			}
			p(">%s</text>\n", html.EscapeString(m.S))
		}
	}
	p("</svg>\n")
	return bw.Flush()
}

func svgColour(c color.RGBA) string {
	if c == black {
		return "black"
	}
	if c == white {
		return "white"
	}
	return fmt.Sprintf("#%02X%02X%02X", c.R, c.G, c.B)
}

func svgPaint(c color.RGBA) string {
	if c.A == 0 {
		return "none"
	}
	return svgColour(c)
}
