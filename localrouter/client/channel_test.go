package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
	"github.com/kvgate/kvgate/localrouter/server"
)

const channelWait = 10 * time.Second

func dialT(t *testing.T, addr string) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func hashPrompt(t *testing.T, tokens []uint32) client.Prompt {
	t.Helper()
	h, err := kvevents.LocalHashes(tokens, 16, "")
	if err != nil {
		t.Fatal(err)
	}
	return client.HashPrompt(h, 16)
}

// waitActive waits for the router to hold want requests.
func waitActive(t *testing.T, r *localrouter.Router, want int) {
	t.Helper()
	testenv.Eventually(t, channelWait, func() (string, bool) {
		if got := r.Active().Stats().Requests; got != want {
			return fmt.Sprintf("router holds %d requests, want %d", got, want), false
		}
		return "", true
	})
}

// A probe over the channel answers what the unary BestWorker answers, with
// hashes packed or repeated, and tokens.
func TestChannelProbeMatchesUnary(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	tokens := prompt(0, 64)
	p.cache("w2", tokens, 3)
	ctx := testenv.Context(t)
	c := dialT(t, p.addr)
	for _, tc := range []struct {
		name   string
		packed bool
		pr     client.Prompt
	}{
		{"packed", true, hashPrompt(t, tokens)},
		{"repeated", false, hashPrompt(t, tokens)},
		{"tokens", true, client.TokenPrompt(tokens)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := c.Channel(client.ChannelOptions{PackedHashes: tc.packed})
			defer ch.Close()
			want, err := c.BestWorker(ctx, tc.pr, client.BestWorkerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := ch.BestWorker(ctx, tc.pr, client.BestWorkerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("channel probe differs from unary (-unary +channel):\n%s", diff)
			}
			if got.WorkerID != "w2" || got.OverlapBlocks != 3 {
				t.Errorf("probe chose %s with %d cached blocks, want w2 with 3", got.WorkerID, got.OverlapBlocks)
			}
		})
	}
	// An allowed-address subset restricts the channel's probe as the
	// unary one's.
	ch := c.Channel(client.ChannelOptions{})
	defer ch.Close()
	only := client.BestWorkerOptions{AllowedAddresses: []string{p.workers["w1"].addr()}}
	got, err := ch.BestWorker(ctx, hashPrompt(t, tokens), only)
	if err != nil || got.WorkerID != "w1" {
		t.Errorf("probe allowed only w1's address chose %q, %v; want w1", got.WorkerID, err)
	}
	if n := p.router.Active().Stats().Requests; n != 0 {
		t.Errorf("probes recorded %d requests, want none", n)
	}
}

// Many concurrent probes through a channel that allows two in flight all
// get their answers.
func TestChannelBoundedInFlight(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	ctx := testenv.Context(t)
	ch := dialT(t, p.addr).Channel(client.ChannelOptions{MaxInFlight: 2})
	defer ch.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := ch.BestWorker(ctx, client.TokenPrompt(prompt(i*100, 48)), client.BestWorkerOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A probe whose context ended returns its context's error and leaves the
// channel working for the others.
func TestChannelProbeContextEnds(t *testing.T) {
	p := startPool("w1")
	defer p.stop()
	ctx := testenv.Context(t)
	ch := dialT(t, p.addr).Channel(client.ChannelOptions{})
	defer ch.Close()
	pr := client.TokenPrompt(prompt(0, 32))
	if _, err := ch.BestWorker(ctx, pr, client.BestWorkerOptions{}); err != nil {
		t.Fatal(err) // the stream is open
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := ch.BestWorker(cctx, pr, client.BestWorkerOptions{}); !errors.Is(err, context.Canceled) || status.Code(err) != codes.Canceled {
		t.Errorf("canceled probe: err = %v, want context.Canceled with code Canceled", err)
	}
	dctx, dcancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer dcancel()
	if _, err := ch.BestWorker(dctx, pr, client.BestWorkerOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("expired probe: err = %v, want context.DeadlineExceeded", err)
	}
	if _, err := ch.BestWorker(ctx, pr, client.BestWorkerOptions{}); err != nil {
		t.Errorf("probe after abandoned ones: %v", err)
	}
	if _, err := ch.BestWorker(ctx, pr, client.BestWorkerOptions{RequestID: "r"}); err == nil {
		t.Error("channel BestWorker with a request id succeeded; it must stay a pure query")
	}
}

// Commits over the channel are recorded and answered; events follow them;
// Free frees, and again is nil.
func TestChannelCommitLifecycle(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	ctx := testenv.Context(t)
	ch := dialT(t, p.addr).Channel(client.ChannelOptions{})
	defer ch.Close()
	answers := make(chan error, 2)
	var got routing.Selection
	tr, err := ch.CommitAsync(ctx, "r1", localrouter.WorkerKey{ID: "w2"}, client.TokenPrompt(prompt(0, 64)), func(sel routing.Selection, err error) {
		got = sel
		answers <- err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Events may follow at once: they are applied after the commit.
	if err := tr.PrefillComplete(ctx); err != nil {
		t.Fatalf("PrefillComplete: %v", err)
	}
	if err := <-answers; err != nil || got.WorkerID != "w2" || got.ISL != 64 {
		t.Fatalf("commit answer = %+v, %v; want w2, ISL 64", got, err)
	}
	waitActive(t, p.router, 1)
	if err := tr.Free(ctx); err != nil {
		t.Fatalf("Free: %v", err)
	}
	waitActive(t, p.router, 0)
	if err := tr.Free(ctx); err != nil {
		t.Errorf("second Free: %v", err)
	}
	if err := tr.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete after Free: %v", err)
	}

	// A refused commit is told to its listener; its Free is nil.
	tr, err = ch.CommitAsync(ctx, "r2", localrouter.WorkerKey{ID: "nobody"}, client.TokenPrompt(prompt(0, 64)), func(_ routing.Selection, err error) { answers <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-answers; !errors.Is(err, localrouter.ErrUnknownWorker) {
		t.Errorf("commit on an unknown worker: answer %v, want ErrUnknownWorker", err)
	}
	if err := tr.Free(ctx); err != nil {
		t.Errorf("Free of a refused commit: %v", err)
	}

	// A refused duplicate's events leave the request it duplicated alone.
	first, err := ch.CommitAsync(ctx, "dup", localrouter.WorkerKey{ID: "w1"}, client.TokenPrompt(prompt(0, 64)), func(_ routing.Selection, err error) { answers <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-answers; err != nil {
		t.Fatal(err)
	}
	dup, err := ch.CommitAsync(ctx, "dup", localrouter.WorkerKey{ID: "w2"}, client.TokenPrompt(prompt(0, 64)), func(_ routing.Selection, err error) { answers <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-answers; !errors.Is(err, localrouter.ErrDuplicateRequest) {
		t.Errorf("duplicate commit: answer %v, want ErrDuplicateRequest", err)
	}
	if err := dup.PrefillComplete(ctx); err == nil {
		t.Error("PrefillComplete of a refused duplicate succeeded")
	}
	if err := dup.Free(ctx); err != nil {
		t.Errorf("Free of a refused duplicate: %v", err)
	}
	waitActive(t, p.router, 1)
	if err := first.Free(ctx); err != nil {
		t.Fatal(err)
	}
	waitActive(t, p.router, 0)
}

// Break means free: every request committed on a channel and not freed is
// freed when its stream ends, whether the channel is closed or the
// connection drops; the channel then opens a new stream.
func TestChannelBreakFreesEveryCommit(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	ctx := testenv.Context(t)
	const n = 40
	commitAll := func(ch *client.Channel, prefix string) []*client.ChannelTracker {
		t.Helper()
		var wg sync.WaitGroup
		var trs []*client.ChannelTracker
		for i := range n {
			wg.Add(1)
			tr, err := ch.CommitAsync(ctx, fmt.Sprint(prefix, i), localrouter.WorkerKey{ID: []string{"w1", "w2"}[i%2]}, client.TokenPrompt(prompt(i*64, 64)),
				func(_ routing.Selection, err error) {
					if err != nil {
						t.Errorf("commit %d: %v", i, err)
					}
					wg.Done()
				})
			if err != nil {
				t.Fatal(err)
			}
			trs = append(trs, tr)
		}
		wg.Wait()
		return trs
	}
	t.Run("close", func(t *testing.T) {
		ch := dialT(t, p.addr).Channel(client.ChannelOptions{})
		trs := commitAll(ch, "close-")
		// One freed the ordinary way, before the break.
		if err := trs[0].Free(ctx); err != nil {
			t.Fatal(err)
		}
		waitActive(t, p.router, n-1)
		ch.Close()
		waitActive(t, p.router, 0)
		for _, tr := range trs {
			if err := tr.Free(ctx); err != nil {
				t.Errorf("Free after the break: %v", err)
			}
		}
		if _, err := ch.BestWorker(ctx, client.TokenPrompt(prompt(0, 32)), client.BestWorkerOptions{}); err == nil {
			t.Error("probe on a closed channel succeeded")
		}
	})
	t.Run("connection-drops", func(t *testing.T) {
		// A connection of our own, so that closing it is a break the
		// channel did not ask for.
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ch := client.New(conn).Channel(client.ChannelOptions{})
		defer ch.Close()
		trs := commitAll(ch, "drop-")
		waitActive(t, p.router, n)
		conn.Close()
		waitActive(t, p.router, 0)
		if err := trs[3].PrefillComplete(ctx); err == nil {
			t.Error("PrefillComplete on a broken stream succeeded")
		}
		if err := trs[3].Free(ctx); err != nil {
			t.Errorf("Free after the break: %v", err)
		}
	})
	t.Run("router-restarts", func(t *testing.T) {
		// The router's gRPC server stops (its streams break) and a new one
		// serves the same router on the same address: the channel's next
		// call opens a new stream on the reconnected connection.
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().String()
		srv, err := server.New(server.Options{Router: p.router, Pool: "demo"})
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		srv.Register(g)
		go g.Serve(lis)
		ch := dialT(t, addr).Channel(client.ChannelOptions{})
		defer ch.Close()
		trs := commitAll(ch, "restart-")
		waitActive(t, p.router, n)
		g.Stop()
		waitActive(t, p.router, 0)
		if lis, err = net.Listen("tcp", addr); err != nil {
			t.Skipf("address %s taken again: %v", addr, err)
		}
		g = grpc.NewServer()
		srv.Register(g)
		go g.Serve(lis)
		defer g.Stop()
		testenv.Eventually(t, channelWait, func() (string, bool) {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if _, err := ch.BestWorker(pctx, client.TokenPrompt(prompt(0, 32)), client.BestWorkerOptions{}); err != nil {
				return err.Error(), false
			}
			return "", true
		})
		if err := trs[0].Free(ctx); err != nil {
			t.Errorf("Free of a request of the broken stream: %v", err)
		}
	})
}

// The server refuses packed hashes whose length is not a multiple of 8 and
// answers a probe's error on its id, leaving the stream open.
func TestChannelServerErrors(t *testing.T) {
	p := startPool("w1")
	defer p.stop()
	ctx := testenv.Context(t)
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := localrouterv1.NewLocalRouterClient(conn).Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hello, err := stream.Recv()
	if err != nil || hello.GetHello().GetMaxInFlight() == 0 {
		t.Fatalf("first answer = %v, %v; want a hello with max_in_flight", hello, err)
	}
	send := func(m *localrouterv1.ChannelRequest) *localrouterv1.ChannelResponse {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := send(&localrouterv1.ChannelRequest{Id: 7, Msg: &localrouterv1.ChannelRequest_Probe{Probe: &localrouterv1.ChannelProbe{
		Prompt: &localrouterv1.Prompt{BlockSize: 16}, PackedHashes: []byte{1, 2, 3}}}})
	if r.GetId() != 7 || codes.Code(r.GetError().GetCode()) != codes.InvalidArgument {
		t.Errorf("probe of 3 packed bytes: answer %v, want id 7, INVALID_ARGUMENT", r)
	}
	r = send(&localrouterv1.ChannelRequest{Id: 8, Msg: &localrouterv1.ChannelRequest_Event{Event: &localrouterv1.ChannelEvent{
		CommitId: 3, Event: localrouterv1.TrackEvent_TRACK_EVENT_FREE}}})
	if r.GetId() != 8 || r.GetError().GetReason() != localrouterv1.ReasonUnknownRequest {
		t.Errorf("free of an unknown request: answer %v, want id 8, reason %s", r, localrouterv1.ReasonUnknownRequest)
	}
	commit := func(id uint64, rid string) *localrouterv1.ChannelResponse {
		return send(&localrouterv1.ChannelRequest{Id: id, Msg: &localrouterv1.ChannelRequest_Commit{Commit: &localrouterv1.CommitRequest{
			RequestId: rid, WorkerId: "w1", Prompt: &localrouterv1.Prompt{TokenIds: prompt(0, 32)}}}})
	}
	if r = commit(20, "c1"); r.GetSelection().GetWorkerId() != "w1" {
		t.Fatalf("commit: answer %v, want w1", r)
	}
	if r = commit(20, "c2"); codes.Code(r.GetError().GetCode()) != codes.InvalidArgument {
		t.Errorf("commit reusing message id 20: answer %v, want INVALID_ARGUMENT", r)
	}
	r = send(&localrouterv1.ChannelRequest{Id: 9})
	if r.GetId() != 9 || codes.Code(r.GetError().GetCode()) != codes.InvalidArgument {
		t.Errorf("empty message: answer %v, want id 9, INVALID_ARGUMENT", r)
	}
	r = send(&localrouterv1.ChannelRequest{Id: 10, Msg: &localrouterv1.ChannelRequest_Probe{Probe: &localrouterv1.ChannelProbe{
		Prompt: &localrouterv1.Prompt{TokenIds: prompt(0, 32)}}}})
	if r.GetId() != 10 || r.GetSelection().GetWorkerId() != "w1" {
		t.Errorf("probe after errors: answer %v, want w1", r)
	}
	// Closing the stream frees c1 (and c2 was never committed).
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	waitActive(t, p.router, 0)
}
