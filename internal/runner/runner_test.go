package runner_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/internal/runner"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestGroupStopsEverything: a failing task stops the group; gRPC, admin
// HTTP and the other tasks are stopped, OnStop runs, Run returns the
// failure.
func TestGroupStopsEverything(t *testing.T) {
	g := runner.NewGroup(quiet)
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.ServeGRPC("grpc", grpc.NewServer(), glis)
	reg := prometheus.NewRegistry()
	alis, err := g.ServeAdmin("admin-addr", "127.0.0.1:0", runner.AdminHandler(reg, nil))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + alis.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/metrics status %d, want 200", resp.StatusCode)
	}
	cancelled := make(chan struct{})
	g.Go(context.Background(), "waiter", func(ctx context.Context) error { <-ctx.Done(); close(cancelled); return nil })
	boom := errors.New("boom")
	g.Go(context.Background(), "failer", func(context.Context) error { return boom })
	stopped := false
	g.OnStop(func(context.Context) error { stopped = true; return nil })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = g.Run(ctx, time.Second)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "failer") {
		t.Errorf("Run = %v, want the failer's error", err)
	}
	<-cancelled
	if !stopped {
		t.Error("OnStop did not run")
	}
	if _, err := net.Dial("tcp", glis.Addr().String()); err == nil {
		t.Error("gRPC listener still open after Run")
	}
	if err := g.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestListenNamesTheFlag(t *testing.T) {
	if _, err := runner.Listen("admin-addr", "nonsense:addr:1"); err == nil || !strings.Contains(err.Error(), "-admin-addr nonsense:addr:1") {
		t.Errorf("got %v", err)
	}
}

type ctxKey struct{}

// TestGoTaskContext: a task's ctx carries the caller's values, outlives the
// caller's cancellation (only Stop ends it, so servers drain first), and a
// task started after Stop starts cancelled.
func TestGoTaskContext(t *testing.T) {
	g := runner.NewGroup(quiet)
	caller, cancelCaller := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	got := make(chan context.Context, 1)
	g.Go(caller, "task", func(ctx context.Context) error { got <- ctx; <-ctx.Done(); return nil })
	ctx := <-got
	cancelCaller()
	if v, _ := ctx.Value(ctxKey{}).(string); v != "v" {
		t.Errorf("task ctx value = %q, want the caller's", v)
	}
	if ctx.Err() != nil {
		t.Error("the caller's cancellation ended the task before Stop")
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Error("Stop did not cancel the task")
	}
	late := make(chan error, 1)
	g.Go(context.Background(), "late", func(ctx context.Context) error { late <- ctx.Err(); return nil })
	if err := <-late; err == nil {
		t.Error("a task started after Stop runs uncancelled")
	}
}
