package loadbench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
)

// testChildEnv makes the test binary a server process that answers each
// line of its input with one line of longLine bytes ("snap " and x's), as
// the decision server answers "snap" with a paced window's snapshot (a
// 12,000-request window's is 163 KB).
const testChildEnv = "LOADBENCH_TEST_LONG_LINE_CHILD"

const longLine = 300_000

func serveTestChild() bool {
	if os.Getenv(testChildEnv) != "1" {
		return false
	}
	fmt.Println("addr test")
	line := "snap " + strings.Repeat("x", longLine-len("snap ")) + "\n"
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if _, err := os.Stdout.WriteString(line); err != nil {
			os.Exit(1)
		}
	}
	return true
}

// TestChildLongLine: a server process's answer longer than a
// bufio.Scanner's 64 KiB is read whole (it was "token too long" from
// 6,000 paced decisions on).
func TestChildLongLine(t *testing.T) {
	ctx := testenv.Context(t)
	ps, err := startChild(ctx, "test child", testChildEnv+"=1")
	if err != nil {
		t.Fatal(err)
	}
	defer ps.stop()
	for range 2 {
		if _, err := ps.in.Write([]byte("snap\n")); err != nil {
			t.Fatal(err)
		}
		line, err := ps.line()
		if err != nil {
			t.Fatalf("line: %v", err)
		}
		if len(line) != longLine || !strings.HasPrefix(line, "snap x") {
			t.Fatalf("line: got %d bytes (%.10q), want %d", len(line), line, longLine)
		}
	}
}

// TestChildStopWhileWriting: stopping a server process that is writing
// an answer nobody reads ends it (a 12,000-request decision benchmark
// hung so: its caller gave up on the answer and waited for the process,
// which waited for its answer to be read and never saw its input close).
func TestChildStopWhileWriting(t *testing.T) {
	ctx := testenv.ContextWithTimeout(t, time.Minute)
	// Not ended by ctx (exec.CommandContext would kill it): only stop
	// may end it here; the cleanup kills it if stop hangs.
	ps, err := startChild(context.Background(), "test child", testChildEnv+"=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.cmd.Process.Kill() })
	if _, err := ps.in.Write([]byte("snap\n")); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { ps.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("stop did not return: the process is blocked writing its answer")
	}
}
