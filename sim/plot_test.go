package sim

import (
	"bytes"
	"flag"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var keepPNG = flag.String("keep-png", "", "also write TestWritePNG's images to this directory, to look at them")

func TestPlotFormatOf(t *testing.T) {
	for _, tc := range []struct {
		path    string
		want    PlotFormat
		wantErr string // a substring of the error; "" for none
	}{
		{path: "ttft.svg", want: PlotSVG},
		{path: "out/TTFT.SVG", want: PlotSVG},
		{path: "ttft.png", want: PlotPNG},
		{path: "/tmp/a.b/ttft.Png", want: PlotPNG},
		{path: "ttft.jpg", wantErr: `unknown plot file extension ".jpg"`},
		{path: "ttft.svg.gz", wantErr: `".gz"`},
		{path: "ttft", wantErr: "ttft: no file extension"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			got, err := PlotFormatOf(tc.path)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("PlotFormatOf(%q) = %v, want %q", tc.path, err, tc.want)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("PlotFormatOf(%q) = %q, %v; want an error containing %q", tc.path, got, err, tc.wantErr)
			case got != tc.want:
				t.Errorf("PlotFormatOf(%q) = %q, want %q", tc.path, got, tc.want)
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.path) {
				t.Errorf("error %q does not name the file %q", err, tc.path)
			}
		})
	}
}

func TestWritePlotPicksTheFormat(t *testing.T) {
	rep := testReport(t, Config{Topologies: []Topology{{Kind: TopologyFlat}}})
	for _, tc := range []struct {
		f    PlotFormat
		head string
	}{
		{PlotSVG, "<svg"},
		{PlotPNG, "\x89PNG\r\n\x1a\n"},
	} {
		var b bytes.Buffer
		if err := rep.WritePlot(&b, tc.f); err != nil {
			t.Fatalf("WritePlot(%s): %v", tc.f, err)
		}
		if !strings.HasPrefix(b.String(), tc.head) {
			t.Errorf("WritePlot(%s) starts %q, want %q", tc.f, b.String()[:min(8, b.Len())], tc.head)
		}
	}
	if err := rep.WritePlot(&bytes.Buffer{}, "gif"); err == nil || !strings.Contains(err.Error(), "gif") {
		t.Errorf("WritePlot(gif) = %v, want an error naming gif", err)
	}
}

// testReport replays the tiny random trace on 2 workers with every default
// policy.
func testReport(t *testing.T, cfg Config) *Report {
	t.Helper()
	cfg.Trace, cfg.TraceName, cfg.Workers, cfg.Seed = randomTrace(t, 40, 2), "tiny", 2, 1
	rep, err := Run(testContext(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestWritePNG(t *testing.T) {
	for _, tc := range []struct {
		name string
		tops []Topology
	}{
		{"flat", nil},
		// Two topologies: the same colours, the second curve set dashed.
		{"flat and pools", []Topology{{Kind: TopologyFlat}, {Kind: TopologyPools, Pools: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// kvgate-cost and kvgate (both the TTFT principle, one in
			// Dynamo's formula) place the tiny trace alike: the later
			// curve would hide the earlier's colour, so one is left out.
			pols := slices.DeleteFunc(DefaultPolicies(), func(p Policy) bool { return p.Name == "kvgate-cost" })
			rep := testReport(t, Config{Topologies: tc.tops, Policies: pols})
			file := filepath.Join(t.TempDir(), "ttft.png")
			var b bytes.Buffer
			if err := rep.WritePNG(&b); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			if *keepPNG != "" {
				os.WriteFile(filepath.Join(*keepPNG, strings.ReplaceAll(tc.name, " ", "_")+".png"), b.Bytes(), 0o644)
			}
			img, err := png.Decode(&b)
			if err != nil {
				t.Fatalf("decoding %s: %v", file, err)
			}
			f := rep.layout()
			want := image.Rect(0, 0, int(math.Ceil(f.W*pngScale)), int(math.Ceil(f.H*pngScale)))
			if got := img.Bounds(); got != want {
				t.Errorf("PNG bounds %v, want %v", got, want)
			}
			colours, _, _ := rep.seriesStyle()
			used := map[color.RGBA]bool{}
			for _, c := range colours {
				used[c] = true
			}
			for _, panel := range []struct {
				name string
				b    box
			}{{"TTFT CDF", f.CDF}, {"hit ratio bars", f.Bars}} {
				found := coloursIn(img, panel.b)
				for i, r := range rep.Results {
					if found[colours[i]] == 0 {
						t.Errorf("%s: no pixel of %s's colour %v in the %s panel", file, r.Label(), colours[i], panel.name)
					}
				}
				// The check can fail: a palette colour no result uses
				// (other than black, the colour of text) is absent.
				for _, c := range palette {
					if !used[c] && c != black && found[c] != 0 {
						t.Errorf("%s: unused colour %v found in the %s panel", file, c, panel.name)
					}
				}
			}
		})
	}
}

// coloursIn counts the pixels of each colour inside b (layout pixels),
// inset to leave out the frame.
func coloursIn(img image.Image, b box) map[color.RGBA]int {
	r := image.Rect(int(b.X*pngScale)+3, int(b.Y*pngScale)+3, int((b.X+b.W)*pngScale)-3, int((b.Y+b.H)*pngScale)-3)
	n := map[color.RGBA]int{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			n[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	return n
}

// TestPlotsOfDegenerateReports: reports with nothing to draw still render
// in both formats.
func TestPlotsOfDegenerateReports(t *testing.T) {
	for _, tc := range []struct {
		name string
		rep  *Report
	}{
		{"no results", &Report{}},
		{"every request rejected", &Report{Results: []*Result{{Topology: "flat", Policy: "kvgate", Rejected: 3}}}},
		{"one request", &Report{OracleHitRatio: 1, Results: []*Result{{Topology: "flat", Policy: "kvgate", HitRatio: 1, ttfts: []float64{0.5}}}}},
		{"long names", &Report{Trace: "<&>", Results: []*Result{
			{Topology: "pools=2", Policy: "cost:credit=8,scale=8,temp=0.5", ttfts: []float64{3, 40_000}},
			{Topology: "disagg=4", Policy: "random", ttfts: []float64{1e6}},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []PlotFormat{PlotSVG, PlotPNG} {
				var b bytes.Buffer
				if err := tc.rep.WritePlot(&b, f); err != nil {
					t.Fatalf("WritePlot(%s): %v", f, err)
				}
				if f == PlotPNG {
					if _, err := png.Decode(&b); err != nil {
						t.Errorf("decoding the PNG: %v", err)
					}
				}
			}
		})
	}
}
