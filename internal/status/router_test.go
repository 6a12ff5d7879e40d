package status_test

import (
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/status"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// TestPoolState: a pool is "ok" only once one of its local routers has
// answered; an unreachable one never is.
func TestPoolState(t *testing.T) {
	up := policies.Health{Routers: 1, Available: 1}
	tests := []struct {
		name string
		h    globalrouter.PoolHealth
		want string
	}{
		{"answered", globalrouter.PoolHealth{Health: up, Routers: []pool.RouterStatus{{Answered: true}}}, "ok"},
		{"never probed", globalrouter.PoolHealth{Health: up, Routers: []pool.RouterStatus{{}}}, "not probed yet"},
		{"failing, never answered", globalrouter.PoolHealth{Health: up, Routers: []pool.RouterStatus{{Failures: 2}}}, "unreachable"},
		{"circuit open", globalrouter.PoolHealth{Health: policies.Health{Routers: 1}, Routers: []pool.RouterStatus{{State: pool.CircuitOpen, Failures: 3}}}, "circuit open"},
		{"no router", globalrouter.PoolHealth{}, "no local router"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := status.PoolState(tt.h); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
