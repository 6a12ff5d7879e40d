package mocker

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestDefaultCurvesAreDefaultTiming(t *testing.T) {
	c := DefaultCurves()
	for _, b := range []Batch{
		{PrefillTokens: 1}, {PrefillTokens: 8192}, {DecodeSeqs: 3, KVUsage: 0.4},
		{PrefillTokens: 500, DecodeSeqs: 1, KVUsage: 1}, {DecodeSeqs: 1, KVUsage: 2},
	} {
		for _, s := range []float64{0, 0.5, 2} {
			c.Speedup = s
			if got, want := c.IterationTime(b), (DefaultTiming{Speedup: s}).IterationTime(b); got != want {
				t.Errorf("speedup %v batch %+v: Curves %v, DefaultTiming %v", s, b, got, want)
			}
		}
	}
}

func TestParseCurves(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       func(c *Curves)
		err        string // substring; "" for none
	}{
		{name: "yaml, prefill only", text: "prefill_ms:\n  quadratic: 8.42e-7\n  linear: 0.03036\n  constant: 33\n",
			want: func(c *Curves) { c.PrefillMS = Poly2{8.42e-7, 0.03036, 33} }},
		{name: "json, decode and speedup", text: `{"decode_ms": {"quadratic": 0, "linear": 20, "constant": 10}, "speedup": 2}`,
			want: func(c *Curves) { c.DecodeMS, c.Speedup = Poly2{0, 20, 10}, 2 }},
		{name: "unknown field", text: "prefill_ms:\n  quadratic: 1\n  cubic: 2\n", err: "t.yaml:3"},
		{name: "wrong type", text: "speedup: fast\n", err: "t.yaml:1"},
		{name: "syntax", text: "prefill_ms: [\n", err: "t.yaml"},
		{name: "not a mapping", text: "- 1\n", err: "want a mapping"},
		{name: "negative prefill", text: "prefill_ms: {quadratic: 0, linear: -1, constant: 5}\n", err: "prefill_ms is"},
		{name: "decode dips below zero", text: "decode_ms: {quadratic: -100, linear: 0, constant: 5}\n", err: "decode_ms is"},
		{name: "vertex below zero", text: "prefill_ms: {quadratic: 1, linear: -100, constant: 100}\n", err: "prefill_ms is"},
		{name: "negative speedup", text: "speedup: -1\n", err: "speedup"},
		{name: "infinite", text: "speedup: .inf\n", err: "finite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCurves("t.yaml", []byte(tc.text), 8192)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrCurves) {
					t.Fatalf("error %v, want one containing %q wrapping ErrCurves", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := DefaultCurves()
			tc.want(&want)
			if got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

// FuzzParseCurves: any input is parsed or refused with an error, never a
// panic, and what is accepted prices every batch positively.
func FuzzParseCurves(f *testing.F) {
	f.Add([]byte("prefill_ms: {quadratic: 8.42e-7, linear: 0.03036, constant: 33}\n"))
	f.Add([]byte(`{"decode_ms": {"linear": 1, "constant": 1}, "speedup": 0.5}`))
	f.Add([]byte("speedup: -1\n"))
	f.Add([]byte("prefill_ms: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCurves("fuzz.yaml", data, 8192)
		if err != nil {
			if !errors.Is(err, ErrCurves) {
				t.Fatalf("error %v does not wrap ErrCurves", err)
			}
			return
		}
		for _, b := range []Batch{{PrefillTokens: 1}, {PrefillTokens: 8192, DecodeSeqs: 1, KVUsage: 0.5}, {DecodeSeqs: 1}} {
			if d := c.IterationTime(b); d <= 0 {
				t.Fatalf("accepted %+v prices %+v at %v", c, b, d)
			}
		}
	})
}

// TestExampleEngineTiming: the shipped example parses.
func TestExampleEngineTiming(t *testing.T) {
	data, err := os.ReadFile("../examples/engine-timing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCurves("engine-timing.yaml", data, 8192)
	if err != nil {
		t.Fatal(err)
	}
	if c.PrefillMS.Constant != 33 || c.DecodeMS != DefaultCurves().DecodeMS {
		t.Errorf("parsed %+v", c)
	}
}
