package config_test

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/lib/config"
)

// TestPositiveOr: zero and negative take the default; a value above zero
// stays.
func TestPositiveOr(t *testing.T) {
	for _, tt := range []struct{ v, want time.Duration }{{0, time.Second}, {-1, time.Second}, {time.Millisecond, time.Millisecond}} {
		v := tt.v
		config.PositiveOr(&v, time.Second)
		if v != tt.want {
			t.Errorf("PositiveOr(%v, 1s): got %v, want %v", tt.v, v, tt.want)
		}
	}
	n := 0
	config.PositiveOr(&n, 200)
	if n != 200 {
		t.Errorf("PositiveOr(0, 200): got %d, want 200", n)
	}
}
