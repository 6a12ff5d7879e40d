package e2e

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// TestRunStopsCleanly is `kvgate up` end to end: Run prints the summary
// once everything is up, serves a request, and stops everything when its
// context ends (Ctrl-C); goleak (TestMain) checks nothing is left running.
func TestRunStopsCleanly(t *testing.T) {
	t.Parallel()
	cfg := up.DefaultConfig()
	cfg.GatewayAddr, cfg.ExtprocAddr, cfg.AdminAddr, cfg.Speedup = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", 20
	cfg.Logger = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(testenv.ContextWithTimeout(t, testTimeout))
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- up.Run(ctx, cfg, pw, 30*time.Second)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var gateway string
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 3 && f[0] == "gateway" && f[1] == "(HTTP)" {
			gateway = f[2]
		}
		if strings.Contains(line, "Ctrl-C stops everything") {
			break
		}
	}
	if gateway == "" {
		t.Fatal("summary names no gateway")
	}
	r := chatURL(t, ctx, httpClient(t), gateway, chatBody("mock-llama", "hi", false, 2))
	if r.status != 200 || r.pool == "" {
		t.Errorf("status %d pool %q, want 200 and a pool", r.status, r.pool)
	}
	cancel()
	rest, _ := io.ReadAll(pr)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(string(rest), "stopped") {
		t.Errorf("after Ctrl-C printed %q, want it to say it stopped", rest)
	}
}
