package client

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func readAllSSE(s string) ([]string, error) {
	r := newSSEReader(strings.NewReader(s))
	var out []string
	for {
		d, err := r.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(d))
	}
}

func TestSSE(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"one event", "data: a\n\n", []string{"a"}},
		{"crlf and cr", "data: a\r\n\r\ndata: b\r\rdata: c\r", []string{"a", "b", "c"}},
		{"multi-line data", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"comments and other fields", ": hi\nevent: x\nid: 1\ndata:a\nretry: 5\n\n", []string{"a"}},
		{"no trailing blank line", "data: a\n\ndata: b", []string{"a", "b"}},
		{"blank lines only", "\n\n\n", nil},
		{"no space after colon", "data:x\n\n", []string{"x"}},
		{"empty data", "data:\n\n", []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readAllSSE(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSSELineTooLong(t *testing.T) {
	_, err := readAllSSE("data: " + strings.Repeat("x", maxSSELine+1) + "\n\n")
	if !errors.Is(err, errSSELineTooLong) {
		t.Errorf("err = %v, want errSSELineTooLong", err)
	}
}

func FuzzSSE(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "data: {\"choices\":[]}\r\n\r\ndata: [DONE]\n\n", ": c\n\nevent: e\ndata: x\ndata: y\n\n", "\r\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		events, err := readAllSSE(s)
		if err != nil {
			t.Fatalf("error on in-memory input: %v", err)
		}
		// Every event's data came from data lines of the input.
		for _, e := range events {
			for _, line := range strings.Split(e, "\n") {
				if !strings.Contains(s, line) {
					t.Fatalf("event line %q is not in the input", line)
				}
			}
		}
	})
}
