package sim

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"

	xdraw "golang.org/x/image/draw"
	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/gobold"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/f64"
	"golang.org/x/image/math/fixed"
	"golang.org/x/image/vector"
)

// pngScale is the PNG's pixels per layout pixel: twice the SVG's size, so
// text stays sharp on high-density screens and when zoomed.
const pngScale = 2

// WritePNG draws the report (Report.layout) as a PNG at pngScale times the
// SVG's size, with the same marks: anti-aliased lines and Go Regular text.
func (rep *Report) WritePNG(w io.Writer) error {
	img, err := rasterize(rep.layout(), pngScale)
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// rasterize draws f at scale device pixels per layout pixel.
func rasterize(f *figure, scale float64) (*image.RGBA, error) {
	r := &raster{
		img:   image.NewRGBA(image.Rect(0, 0, int(math.Ceil(f.W*scale)), int(math.Ceil(f.H*scale)))),
		scale: scale,
		faces: map[faceKey]font.Face{},
	}
	defer r.close()
	for _, m := range f.Marks {
		var err error
		switch m := m.(type) {
		case rect:
			r.rect(m)
		case path:
			r.path(m)
		case text:
			err = r.text(m)
		}
		if err != nil {
			return nil, err
		}
	}
	return r.img, nil
}

type faceKey struct {
	size float64
	bold bool
}

type raster struct {
	img   *image.RGBA
	scale float64
	faces map[faceKey]font.Face
	bold  *opentype.Font
}

func (r *raster) close() {
	for _, f := range r.faces {
		f.Close()
	}
}

func (r *raster) rect(m rect) {
	s := r.scale
	x0, y0 := math.Round(m.X*s), math.Round(m.Y*s)
	x1, y1 := math.Round((m.X+m.W)*s), math.Round((m.Y+m.H)*s)
	if m.Fill.A != 0 {
		draw.Draw(r.img, image.Rect(int(x0), int(y0), int(x1), int(y1)), image.NewUniform(m.Fill), image.Point{}, draw.Over)
	}
	if m.Stroke.A != 0 {
		// Layout coordinates, so the frame is stroked like any line.
		x0, y0, x1, y1 := m.X, m.Y, m.X+m.W, m.Y+m.H
		r.path(path{Pts: []point{{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}, {x0, y0}}, Stroke: m.Stroke, Width: 1})
	}
}

// path strokes m: each segment (after dashing) is a quad and each inner
// joint a small polygon, all wound the same way so overlaps do not cancel
// in the non-zero rasterizer. Axis-aligned lines are snapped to whole
// pixels, so grid lines and frames stay crisp.
func (r *raster) path(m path) {
	s := r.scale
	w := max(1, math.Round(m.Width*s))
	pts := make([]point, len(m.Pts))
	for i, p := range m.Pts {
		pts[i] = point{p.X * s, p.Y * s}
	}
	snap := func(v float64) float64 { return math.Round(v-w/2) + w/2 }
	if len(pts) == 2 && (pts[0].X == pts[1].X || pts[0].Y == pts[1].Y) {
		if pts[0].X == pts[1].X {
			pts[0].X, pts[1].X = snap(pts[0].X), snap(pts[1].X)
		} else {
			pts[0].Y, pts[1].Y = snap(pts[0].Y), snap(pts[1].Y)
		}
	}
	var polys [][]point
	for _, seg := range dashed(pts, scaleDash(m.Dash, s)) {
		for i := 1; i < len(seg); i++ {
			if q := quad(seg[i-1], seg[i], w/2); q != nil {
				polys = append(polys, q)
			}
			if i+1 < len(seg) {
				polys = append(polys, disc(seg[i], w/2))
			}
		}
	}
	r.fill(polys, m.Stroke)
}

// fill rasterizes the polygons into their bounding box and composites the
// colour through the coverage.
func (r *raster) fill(polys [][]point, c color.RGBA) {
	if len(polys) == 0 {
		return
	}
	lo, hi := point{math.Inf(1), math.Inf(1)}, point{math.Inf(-1), math.Inf(-1)}
	for _, poly := range polys {
		for _, p := range poly {
			lo = point{min(lo.X, p.X), min(lo.Y, p.Y)}
			hi = point{max(hi.X, p.X), max(hi.Y, p.Y)}
		}
	}
	bb := image.Rect(int(math.Floor(lo.X)), int(math.Floor(lo.Y)), int(math.Ceil(hi.X)), int(math.Ceil(hi.Y))).Intersect(r.img.Bounds())
	if bb.Empty() {
		return
	}
	z := vector.NewRasterizer(bb.Dx(), bb.Dy())
	ox, oy := float64(bb.Min.X), float64(bb.Min.Y)
	for _, poly := range polys {
		z.MoveTo(float32(poly[0].X-ox), float32(poly[0].Y-oy))
		for _, p := range poly[1:] {
			z.LineTo(float32(p.X-ox), float32(p.Y-oy))
		}
		z.ClosePath()
	}
	z.Draw(r.img, bb, image.NewUniform(c), image.Point{})
}

func scaleDash(d []float64, s float64) []float64 {
	out := make([]float64, len(d))
	for i, v := range d {
		out[i] = v * s
	}
	return out
}

// dashed cuts a polyline into its "on" pieces; no pattern keeps it whole.
func dashed(pts []point, pattern []float64) [][]point {
	total := 0.0
	for _, v := range pattern {
		total += v
	}
	if len(pattern) == 0 || total <= 0 {
		return [][]point{pts}
	}
	var out [][]point
	var cur []point
	k, left, on := 0, pattern[0], true
	if on {
		cur = []point{pts[0]}
	}
	for i := 1; i < len(pts); i++ {
		a, b := pts[i-1], pts[i]
		segLen := math.Hypot(b.X-a.X, b.Y-a.Y)
		pos := 0.0
		for segLen-pos > left {
			pos += left
			t := pos / segLen
			p := point{a.X + (b.X-a.X)*t, a.Y + (b.Y-a.Y)*t}
			if on {
				out = append(out, append(cur, p))
				cur = nil
			} else {
				cur = []point{p}
			}
			on = !on
			k = (k + 1) % len(pattern)
			left = pattern[k]
		}
		left -= segLen - pos
		if on {
			cur = append(cur, b)
		}
	}
	if on && len(cur) > 1 {
		out = append(out, cur)
	}
	return out
}

// quad is the rectangle of half-width hw around segment a–b, clockwise on
// screen; nil for a point.
func quad(a, b point, hw float64) []point {
	dx, dy := b.X-a.X, b.Y-a.Y
	l := math.Hypot(dx, dy)
	if l == 0 {
		return nil
	}
	nx, ny := -dy/l*hw, dx/l*hw
	q := []point{{a.X + nx, a.Y + ny}, {b.X + nx, b.Y + ny}, {b.X - nx, b.Y - ny}, {a.X - nx, a.Y - ny}}
	return clockwise(q)
}

// disc is an octagon of radius rad around c, clockwise on screen: a round
// joint.
func disc(c point, rad float64) []point {
	var p []point
	for i := range 8 {
		a := float64(i) * math.Pi / 4
		p = append(p, point{c.X + rad*math.Cos(a), c.Y + rad*math.Sin(a)})
	}
	return clockwise(p)
}

func clockwise(p []point) []point {
	area := 0.0
	for i := range p {
		j := (i + 1) % len(p)
		area += p[i].X*p[j].Y - p[j].X*p[i].Y
	}
	if area < 0 {
		for i, j := 0, len(p)-1; i < j; i, j = i+1, j-1 {
			p[i], p[j] = p[j], p[i]
		}
	}
	return p
}

func (r *raster) face(size float64, bold bool) (font.Face, error) {
	k := faceKey{size * r.scale, bold}
	if f, ok := r.faces[k]; ok {
		return f, nil
	}
	fnt := regular()
	if bold {
		if r.bold == nil {
			b, err := opentype.Parse(gobold.TTF)
			if err != nil {
				return nil, fmt.Errorf("parsing Go Bold: %w", err)
			}
			r.bold = b
		}
		fnt = r.bold
	}
	f, err := opentype.NewFace(fnt, &opentype.FaceOptions{Size: k.size, DPI: 72, Hinting: font.HintingFull})
	if err != nil {
		return nil, err
	}
	r.faces[k] = f
	return f, nil
}

// text draws m straight onto the image, or, when turned, onto a scratch
// image that is then rotated about the anchor into place.
func (r *raster) text(m text) error {
	face, err := r.face(m.Size, m.Bold)
	if err != nil {
		return err
	}
	s := r.scale
	adv := font.MeasureString(face, m.S)
	var shift fixed.Int26_6
	switch m.Anchor {
	case anchorMiddle:
		shift = adv / 2
	case anchorEnd:
		shift = adv
	}
	src := image.NewUniform(m.Fill)
	if m.Rotate == 0 {
		d := font.Drawer{Dst: r.img, Src: src, Face: face,
			Dot: fixed.Point26_6{X: fixed.Int26_6(m.X*s*64) - shift, Y: fixed.I(int(math.Round(m.Y * s)))}}
		d.DrawString(m.S)
		return nil
	}
	met := face.Metrics()
	pad := 2
	w := adv.Ceil() + 2*pad
	h := (met.Ascent + met.Descent).Ceil() + 2*pad
	scratch := image.NewRGBA(image.Rect(0, 0, w, h))
	base := fixed.I(pad) + met.Ascent
	d := font.Drawer{Dst: scratch, Src: src, Face: face, Dot: fixed.Point26_6{X: fixed.I(pad), Y: base}}
	d.DrawString(m.S)
	// Scratch anchor point → image anchor point, turned about it.
	ax, ay := float64(pad)+float64(shift)/64, float64(base)/64
	th := m.Rotate * math.Pi / 180
	c, sn := math.Cos(th), math.Sin(th)
	tx, ty := m.X*s, m.Y*s
	aff := f64.Aff3{
		c, -sn, tx - c*ax + sn*ay,
		sn, c, ty - sn*ax - c*ay,
	}
	xdraw.BiLinear.Transform(r.img, aff, scratch, scratch.Bounds(), xdraw.Over, nil)
	return nil
}
