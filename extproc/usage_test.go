package extproc

import "testing"

// The SSE parser's tests (split-invariance, bounds) are lib/sse's.

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
