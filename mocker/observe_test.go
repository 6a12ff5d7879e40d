package mocker

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testenv"
)

// observed records a RequestObserver's calls, in order.
type observed struct {
	mu    sync.Mutex
	calls []string
	ch    chan struct{}
}

func (o *observed) add(s string) {
	o.mu.Lock()
	o.calls = append(o.calls, s)
	o.mu.Unlock()
	select {
	case o.ch <- struct{}{}:
	default:
	}
}

func (o *observed) Admitted(rank int, _, clientID string, _ time.Time) {
	o.add(fmt.Sprintf("admitted %d %s", rank, clientID))
}

func (o *observed) Left(rank int, _ string, _ time.Time, reason string) {
	o.add(fmt.Sprintf("left %d %s", rank, reason))
}

// wait waits until n calls were made and returns them.
func (o *observed) wait(ctx context.Context, t *testing.T, n int) []string {
	t.Helper()
	for {
		o.mu.Lock()
		got := append([]string(nil), o.calls...)
		o.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-o.ch:
		case <-ctx.Done():
			t.Fatalf("observer calls %q, want %d: %v", got, n, ctx.Err())
		}
	}
}

// TestRequestObserver: the observer sees each request admitted with its
// client's X-Request-Id and leave when it finishes or its client goes
// away: the moments the running+waiting count changes.
func TestRequestObserver(t *testing.T) {
	ctx := testenv.Context(t)
	obs := &observed{ch: make(chan struct{}, 1)}
	srv, err := NewServer(ServerConfig{Model: "m", Engine: Config{Speedup: 1}}, ServerOptions{Logger: testenv.Logger(t), Registry: prometheus.NewRegistry(), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Run(rctx)
	}()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		stop()
		<-done
	})

	resp := post(ctx, t, hs.URL+"/v1/completions", `{"prompt":"a b c","max_tokens":2,"stream":true}`, map[string]string{"X-Request-Id": "finishes"})
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got, want := obs.wait(ctx, t, 2), []string{"admitted 0 finishes", "left 0 length"}; strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("observer calls %q, want %q", got, want)
	}

	reqCtx, hangUp := context.WithCancel(ctx)
	resp = post(reqCtx, t, hs.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"a b c"}],"max_tokens":100000,"stream":true}`, map[string]string{"X-Request-Id": "goes-away"})
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	hangUp()
	resp.Body.Close()
	got := obs.wait(ctx, t, 4)
	if want := []string{"admitted 0 goes-away", "left 0 abort"}; strings.Join(got[2:], "; ") != strings.Join(want, "; ") {
		t.Errorf("observer calls %q after a client went away, want %q", got[2:], want)
	}
}
