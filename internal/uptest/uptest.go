// Package uptest starts the whole local system (internal/up) for a test:
// every listener on a loopback port 0, logs discarded, mutate applied to
// the configuration last, and the system closed at the test's cleanup.
// e2e, the Grafana dashboard test and the status page's browser test use
// it; package up itself never imports testing.
package uptest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// Timeout bounds Start and Close each.
const Timeout = time.Minute

// Start starts kvgate up with up.DefaultConfig as changed by mutate, in
// order, and closes it when the test ends (a Close error fails the test).
func Start(t testing.TB, mutate ...func(*up.Config)) *up.System {
	t.Helper()
	cfg := up.DefaultConfig()
	cfg.OnLoopback()
	cfg.Logger = slog.New(slog.DiscardHandler)
	for _, f := range mutate {
		f(&cfg)
	}
	s, err := up.Start(testenv.ContextWithTimeout(t, Timeout), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}
