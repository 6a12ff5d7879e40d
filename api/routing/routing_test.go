package routing

import (
	"math"
	"testing"
)

func TestSelectionTokens(t *testing.T) {
	for _, tt := range []struct {
		name             string
		s                Selection
		cached, uncached int
	}{
		{"none cached", Selection{BlockSize: 16, ISL: 40}, 0, 40},
		{"partly cached", Selection{BlockSize: 16, ISL: 40, OverlapBlocks: 2}, 32, 8},
		{"all cached", Selection{BlockSize: 16, ISL: 32, OverlapBlocks: 2}, 32, 0},
		{"ISL unknown", Selection{BlockSize: 16, OverlapBlocks: 2}, 32, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.CachedTokens(); got != tt.cached {
				t.Errorf("CachedTokens() = %d, want %d", got, tt.cached)
			}
			if got := tt.s.UncachedTokens(); got != tt.uncached {
				t.Errorf("UncachedTokens() = %d, want %d", got, tt.uncached)
			}
		})
	}
}

func TestOverrideValidate(t *testing.T) {
	ok := 0.5
	if err := (*Override)(nil).Validate(); err != nil {
		t.Errorf("nil override: %v", err)
	}
	if err := (&Override{OverlapScoreCredit: &ok, PrefillLoadScale: &ok, RouterTemperature: &ok}).Validate(); err != nil {
		t.Errorf("good override: %v", err)
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1} {
		for name, o := range map[string]*Override{
			"overlap_score_credit": {OverlapScoreCredit: &v},
			"prefill_load_scale":   {PrefillLoadScale: &v},
			"router_temperature":   {RouterTemperature: &v},
		} {
			if err := o.Validate(); err == nil {
				t.Errorf("%s %v: no error", name, v)
			}
		}
	}
}

func TestAddressAllowed(t *testing.T) {
	for _, c := range []struct {
		allowed []string
		addr    string
		want    bool
	}{
		{nil, "10.0.0.1:8000", true},
		{[]string{"10.0.0.1:8000"}, "10.0.0.1:8000", true},
		{[]string{" 10.0.0.1:8000 "}, "10.0.0.1:8000", true},
		{[]string{"10.0.0.1"}, "10.0.0.1:9000", true},
		{[]string{"10.0.0.1:8000"}, "10.0.0.1:9000", false},
		{[]string{"10.0.0.2"}, "10.0.0.1:8000", false},
		{[]string{"::1"}, "[::1]:8000", true},
		{[]string{"10.0.0.1:8000"}, "", false},
	} {
		if got := AddressAllowed(c.allowed, c.addr); got != c.want {
			t.Errorf("AddressAllowed(%q, %q) = %v, want %v", c.allowed, c.addr, got, c.want)
		}
	}
}
