package extproc

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func collectSSE(maxLine int, chunks ...[]byte) []string {
	var got []string
	p := newSSEParser(maxLine, func(d []byte) { got = append(got, string(d)) })
	for _, c := range chunks {
		p.Write(c)
	}
	p.Close()
	return got
}

func TestSSEParser(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []string
	}{
		{"lf", "data: a\n\ndata: b\n\n", []string{"a", "b"}},
		{"crlf", "data: a\r\n\r\ndata:b\r\n\r\n", []string{"a", "b"}},
		{"cr", "data: a\r\rdata: b\r\r", []string{"a", "b"}},
		{"multi-line data", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"comments and fields", ": ping\nevent: x\nid: 1\nretry: 5\ndata: a\n\n", []string{"a"}},
		{"no space", "data:a\n\n", []string{"a"}},
		{"field without colon", "data\n\n", []string{""}},
		{"blank lines only", "\n\n\n", nil},
		{"unterminated last event", "data: a\n\ndata: b", []string{"a", "b"}},
		{"line too long dropped", "data: " + strings.Repeat("x", 100) + "\n\ndata: ok\n\n", []string{"ok"}},
		{"event too long dropped", strings.Repeat("data: "+strings.Repeat("y", 30)+"\n", 5) + "\ndata: ok\n\n", []string{"ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := collectSSE(64, []byte(tc.in))
			if diff := cmp.Diff(tc.want, whole); diff != "" {
				t.Errorf("whole input (-want +got):\n%s", diff)
			}
			for i := 0; i <= len(tc.in); i++ {
				got := collectSSE(64, []byte(tc.in[:i]), []byte(tc.in[i:]))
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Fatalf("split at %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

func TestUsageOf(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Usage
		ok   bool
	}{
		{`{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`, Usage{3, 4}, true},
		{`{"choices":[],"usage":null}`, Usage{}, false},
		{`{"choices":[]}`, Usage{}, false},
		{`[DONE]`, Usage{}, false},
		{`{"usage":"x"}`, Usage{}, false},
	} {
		got, ok := usageOf([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("usageOf(%s) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzSSE: however a stream is cut into chunks, the parser sees the same
// events as when fed whole.
func FuzzSSE(f *testing.F) {
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"), uint16(3), uint16(7))
	f.Add([]byte("data: a\r\n\r\n: c\rdata: b\r\r"), uint16(9), uint16(10))
	f.Add([]byte("data: a\r"), uint16(8), uint16(8))
	f.Fuzz(func(t *testing.T, in []byte, a, b uint16) {
		i, j := int(a)%(len(in)+1), int(b)%(len(in)+1)
		if i > j {
			i, j = j, i
		}
		whole := collectSSE(256, in)
		split := collectSSE(256, in[:i], in[i:j], in[j:])
		if diff := cmp.Diff(whole, split); diff != "" {
			t.Fatalf("split at %d,%d differs (-whole +split):\n%s", i, j, diff)
		}
		for _, d := range whole {
			usageOf([]byte(d))
		}
	})
}
