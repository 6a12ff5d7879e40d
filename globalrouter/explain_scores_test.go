package globalrouter

import (
	"testing"

	"github.com/kvgate/kvgate/api/routing"
)

func TestFormatScores(t *testing.T) {
	for _, tt := range []struct {
		in   []routing.Score
		want string
	}{
		{nil, ""},
		{[]routing.Score{{Name: "cost", Raw: 412, Weight: 1, Contribution: 412}, {Name: "prefix", Raw: -0.4, Weight: 2, Contribution: -0.8}}, "cost:412.0,prefix:-0.8"},
		{[]routing.Score{{Name: "cold", Contribution: 0.33333333}}, "cold:0.3333"},
	} {
		if got := formatScores(tt.in); got != tt.want {
			t.Errorf("formatScores(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
