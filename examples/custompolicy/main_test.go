package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/app"
)

// TestOptionsTakeEffect: the example's configuration checks clean with the
// program's options, and the shipped binary's registries refuse both of
// its names (so the options, not a built-in, are what accepts them).
func TestOptionsTakeEffect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := app.Run(ctx, []string{"policy", "check", "pools.yaml"}, options()...); err != nil {
		t.Fatalf("policy check with the options: %v", err)
	}
	stderr, err := runCapturing(t, func() error { return app.Run(ctx, []string{"policy", "check", "pools.yaml"}) })
	if err == nil || !strings.Contains(stderr, `unknown policy "least-decode"`) {
		t.Errorf("policy check without the options: %v, %q; want least-decode refused", err, stderr)
	}
	stderr, err = runCapturing(t, func() error {
		return app.Run(ctx, []string{"policy", "check", "pools.yaml"}, app.WithPolicy("least-decode", newLeastDecode))
	})
	if err == nil || !strings.Contains(stderr, `unknown filter or scorer "fewest-requests"`) {
		t.Errorf("policy check without the scorer: %v, %q; want fewest-requests refused", err, stderr)
	}
	// The replay of the configuration builds both (the global router's
	// chain, each pool's local router).
	replay := []string{"policy", "replay", "pools.yaml", "--generate", "agentic:sessions=4,max_turns=2,seed=1",
		"--max-requests", "20", "--workers", "2", "--json"}
	if _, err := runCapturing(t, func() error { return app.Run(ctx, replay, options()...) }); err != nil {
		t.Errorf("policy replay with the options: %v", err)
	}
	// A name taken is refused before anything runs.
	if err := app.Run(ctx, []string{"policy", "check", "pools.yaml"}, app.WithScorer("ttft", newFewestRequests)); err == nil || !strings.Contains(err.Error(), "ttft") {
		t.Errorf("a scorer named as a built-in: %v, want an error", err)
	}
}

// runCapturing runs f with os.Stderr captured (policy check prints its
// findings there) and returns what it wrote.
func runCapturing(t *testing.T, f func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	ferr := f()
	os.Stderr = saved
	w.Close()
	return <-done, ferr
}
