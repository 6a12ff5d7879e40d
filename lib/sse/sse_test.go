package sse

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

func collect(max int, chunks ...[]byte) []string {
	var got []string
	p := NewParser(max, func(d []byte) { got = append(got, string(d)) })
	for _, c := range chunks {
		p.Write(c)
	}
	p.Close()
	return got
}

var cases = []struct {
	name string
	in   string
	want []string
}{
	{"lf", "data: a\n\ndata: b\n\n", []string{"a", "b"}},
	{"crlf", "data: a\r\n\r\ndata:b\r\n\r\n", []string{"a", "b"}},
	{"cr", "data: a\r\rdata: b\r\r", []string{"a", "b"}},
	{"crlf and cr", "data: a\r\n\r\ndata: b\r\rdata: c\r", []string{"a", "b", "c"}},
	{"multi-line data", "data: a\ndata: b\n\n", []string{"a\nb"}},
	{"comments and fields", ": ping\nevent: x\nid: 1\nretry: 5\ndata: a\n\n", []string{"a"}},
	{"no space", "data:a\n\n", []string{"a"}},
	{"field without colon", "data\n\n", []string{""}},
	{"empty data", "data:\n\n", []string{""}},
	{"blank lines only", "\n\n\n", nil},
	{"unterminated last event", "data: a\n\ndata: b", []string{"a", "b"}},
}

func TestParser(t *testing.T) {
	long := []struct {
		name string
		in   string
		want []string
	}{
		{"line too long dropped", "data: " + strings.Repeat("x", 100) + "\n\ndata: ok\n\n", []string{"ok"}},
		{"event too long dropped", strings.Repeat("data: "+strings.Repeat("y", 30)+"\n", 5) + "\ndata: ok\n\n", []string{"ok"}},
	}
	for _, tc := range append(cases[:len(cases):len(cases)], long...) {
		t.Run(tc.name, func(t *testing.T) {
			whole := collect(64, []byte(tc.in))
			if diff := cmp.Diff(tc.want, whole); diff != "" {
				t.Errorf("whole input (-want +got):\n%s", diff)
			}
			for i := 0; i <= len(tc.in); i++ {
				got := collect(64, []byte(tc.in[:i]), []byte(tc.in[i:]))
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Fatalf("split at %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

func TestParserDropped(t *testing.T) {
	p := NewParser(12, func([]byte) {})
	p.Write([]byte("data: " + strings.Repeat("x", 9) + "\n\ndata: aaa\ndata: bbb\ndata: ccc\ndata: ddd\n\n"))
	p.Close()
	if p.Dropped() != 2 {
		t.Errorf("Dropped() = %d, want 2 (one line, one event)", p.Dropped())
	}
}

func readAll(r *Reader) ([]string, error) {
	var out []string
	for {
		d, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(d))
	}
}

func TestReader(t *testing.T) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				got, err := readAll(NewReader(r, 64))
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestReaderTooLong(t *testing.T) {
	for _, in := range []string{
		"data: a\n\ndata: " + strings.Repeat("x", 64) + "\n\ndata: b\n\n",
		"data: a\n\n" + strings.Repeat("data: "+strings.Repeat("y", 30)+"\n", 3) + "\ndata: b\n\n",
		"data: a\n\ndata: " + strings.Repeat("x", 64),
	} {
		got, err := readAll(NewReader(strings.NewReader(in), 64))
		if !errors.Is(err, ErrTooLong) {
			t.Errorf("%q: err = %v, want ErrTooLong", in, err)
		}
		if diff := cmp.Diff([]string{"a"}, got); diff != "" {
			t.Errorf("%q: events before the error (-want +got):\n%s", in, diff)
		}
	}
}

func TestReaderError(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("data: a\n\n"), iotest.ErrReader(boom)), 64)
	got, err := readAll(r)
	if !errors.Is(err, boom) || len(got) != 1 {
		t.Errorf("events %q, err %v: want [a] then boom", got, err)
	}
}

// FuzzParser: however a stream is cut into chunks, the parser sees the
// same events as when fed whole, and a Reader the same as the Parser.
func FuzzParser(f *testing.F) {
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"), uint16(3), uint16(7))
	f.Add([]byte("data: a\r\n\r\n: c\rdata: b\r\r"), uint16(9), uint16(10))
	f.Add([]byte("data: a\r"), uint16(8), uint16(8))
	f.Fuzz(func(t *testing.T, in []byte, a, b uint16) {
		i, j := int(a)%(len(in)+1), int(b)%(len(in)+1)
		if i > j {
			i, j = j, i
		}
		whole := collect(256, in)
		split := collect(256, in[:i], in[i:j], in[j:])
		if diff := cmp.Diff(whole, split); diff != "" {
			t.Fatalf("split at %d,%d differs (-whole +split):\n%s", i, j, diff)
		}
		p := NewParser(256, func([]byte) {})
		p.Write(in)
		p.Close()
		if p.Dropped() > 0 {
			return
		}
		read, err := readAll(NewReader(iotest.HalfReader(strings.NewReader(string(in))), 256))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(whole, read); diff != "" {
			t.Fatalf("Reader differs from Parser (-parser +reader):\n%s", diff)
		}
	})
}
