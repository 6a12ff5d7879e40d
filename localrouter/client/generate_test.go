package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}

const testTimeout = 30 * time.Second

func setup(t *testing.T, ids ...string) (*pool, *client.Client, context.Context) {
	t.Helper()
	return setupWith(t, localrouter.DefaultConfig(), ids...)
}

// setupWith is setup with the router configuration cfg.
func setupWith(t *testing.T, cfg localrouter.Config, ids ...string) (*pool, *client.Client, context.Context) {
	t.Helper()
	p := startPoolWith(cfg, ids...)
	t.Cleanup(p.stop)
	c, err := client.Dial(p.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return p, c, ctx
}

func (p *pool) load(id string) localrouter.WorkerLoad {
	return p.router.Active().Load(localrouter.WorkerKey{ID: id})
}

func (p *pool) waitIdle(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		if n := p.router.Active().Stats().Requests; n != 0 {
			return testenv.Errorf("%d requests active, want 0", n)
		}
		return "", true
	})
}

func TestGenerateStreamsAndTracks(t *testing.T) {
	p, c, ctx := setup(t, "w1", "w2")
	tokens := prompt(0, 64)
	p.cache("w2", tokens, 2)
	stream, err := c.Generate(ctx, tokens, "demo", client.GenerateOptions{MaxTokens: 8, RequestID: "g1"})
	if err != nil {
		t.Fatal(err)
	}
	if sel := stream.Selection(); sel.WorkerID != "w2" || sel.OverlapBlocks != 2 {
		t.Errorf("selection %+v, want w2 with 2 blocks cached", sel)
	}
	if l := p.load("w2"); l.ActiveRequests != 1 || l.PrefillTokens != 32 {
		t.Errorf("load before the first token %+v, want 1 request, 32 uncached tokens in prefill", l)
	}
	var texts []string
	for {
		ch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if len(texts) == 0 && ch.Text != "" {
			if l := p.load("w2"); l.ActiveRequests != 1 || l.PrefillTokens != 0 {
				t.Errorf("load after the first token %+v, want 1 request, prefill done", l)
			}
		}
		texts = append(texts, ch.Text)
	}
	if diff := cmp.Diff([]string{"Hello", " from", " w2", ""}, texts); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if l := p.load("w2"); l.ActiveRequests != 0 {
		t.Errorf("load after the end %+v, want idle", l)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the end = %v, want io.EOF", err)
	}
	got := p.workers["w2"].got()
	if len(got) != 1 || !got[0].Stream || got[0].Model != "demo" || got[0].MaxTokens != 8 || !cmp.Equal(got[0].Prompt, tokens) {
		t.Errorf("worker got %+v, want one streamed request of the prompt's token ids", got)
	}
	if err := stream.Close(); err != nil {
		t.Errorf("Close after the end: %v", err)
	}
}

func TestGenerateForcedWorker(t *testing.T) {
	p, c, ctx := setup(t, "w1", "w2")
	tokens := prompt(0, 64)
	p.cache("w2", tokens, 4)
	stream, err := c.Generate(ctx, tokens, "demo", client.GenerateOptions{Worker: &localrouter.WorkerKey{ID: "w1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if _, err := io.ReadAll(readerOf(stream)); err != nil {
		t.Fatal(err)
	}
	if n := len(p.workers["w1"].got()); n != 1 {
		t.Errorf("w1 got %d requests, want 1", n)
	}
	if _, err := c.Generate(ctx, tokens, "demo", client.GenerateOptions{Worker: &localrouter.WorkerKey{ID: "ghost"}}); !errors.Is(err, localrouter.ErrUnknownWorker) {
		t.Errorf("Generate on an unknown worker = %v, want ErrUnknownWorker", err)
	}
	p.waitIdle(t)
}

func TestGenerateFreesOnWorkerError(t *testing.T) {
	p, c, ctx := setup(t, "w1")
	p.workers["w1"].fail = http.StatusServiceUnavailable
	_, err := c.Generate(ctx, prompt(0, 32), "demo", client.GenerateOptions{})
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "engine overloaded") {
		t.Errorf("Generate = %v, want the worker's 503 and message", err)
	}
	p.waitIdle(t)
	if _, err := c.Generate(ctx, nil, "demo", client.GenerateOptions{}); !errors.Is(err, localrouter.ErrEmptyRequest) {
		t.Errorf("Generate with no tokens = %v, want ErrEmptyRequest", err)
	}
}

func TestGenerateFreesOnCancel(t *testing.T) {
	p, c, ctx := setup(t, "w1")
	hold := make(chan struct{})
	defer close(hold)
	p.workers["w1"].hold = hold
	gctx, cancel := context.WithCancel(ctx)
	stream, err := c.Generate(gctx, prompt(0, 32), "demo", client.GenerateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for { // up to the first token
		ch, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ch.Text != "" {
			break
		}
	}
	if n := p.router.Active().Stats().Requests; n != 1 {
		t.Fatalf("%d requests active mid-stream, want 1", n)
	}
	cancel()
	if _, err := stream.Recv(); err == nil {
		t.Errorf("Recv after cancel succeeded")
	}
	p.waitIdle(t)
}

func TestStreamCloseFrees(t *testing.T) {
	p, c, ctx := setup(t, "w1")
	hold := make(chan struct{})
	defer close(hold)
	p.workers["w1"].hold = hold
	stream, err := c.Generate(ctx, prompt(0, 32), "demo", client.GenerateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stream.Close()
	p.waitIdle(t)
	if _, err := stream.Recv(); err == nil {
		t.Errorf("Recv after Close succeeded")
	}
}

func TestErrorsUnwrapAcrossTheWire(t *testing.T) {
	_, c, ctx := setup(t, "w1")
	err := c.Free(ctx, "nope")
	var e *client.Error
	if !errors.As(err, &e) || e.Code.String() != "NotFound" || e.Reason != "UNKNOWN_REQUEST" || !errors.Is(err, localrouter.ErrUnknownRequest) {
		t.Errorf("Free(unknown) = %#v", err)
	}
}

// readerOf drains a stream's text.
func readerOf(s *client.Stream) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		for {
			ch, err := s.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				pw.CloseWithError(err)
				return
			}
			io.WriteString(pw, ch.Text)
		}
	}()
	return pr
}
