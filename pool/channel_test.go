package pool_test

import (
	"context"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// Over the channel dialer: probes, pipelined commits and their lifecycle,
// and closing the connections frees every request still committed.
func TestChannelDialer(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 3)...)
	toks := tokens(100, 1)
	srv.Store(t, "w-1", toks[:64])
	conns := pool.NewConns(pool.ChannelDialer(), pool.CircuitOptions{}, nil)
	p := open(t, conns, "p", srv.Addr)
	sel, err := p.Probe(ctx, prompt(t, toks, 16))
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if sel.WorkerID != "w-1" || sel.OverlapBlocks != 4 || sel.Router != srv.Addr {
		t.Errorf("Probe = %+v, want w-1 with 4 cached blocks via %s", sel, srv.Addr)
	}
	tr, csel, err := p.Commit(ctx, sel.Router, pool.Commit{RequestID: "r1", WorkerID: "w-2", Prompt: prompt(t, toks, 16)})
	if err != nil || csel.WorkerID != "w-2" {
		t.Fatalf("Commit = %+v, %v; want w-2", csel, err)
	}
	if err := tr.PrefillComplete(ctx); err != nil {
		t.Errorf("PrefillComplete: %v", err)
	}
	if err := tr.Free(ctx); err != nil {
		t.Errorf("Free: %v", err)
	}
	if err := srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 10)
	for i := range 10 {
		if _, err := p.CommitAsync(ctx, "", pool.Commit{RequestID: fmt.Sprint("open-", i), WorkerID: "w-0", Prompt: prompt(t, toks, 16)},
			func(_ routing.Selection, err error) { done <- err }); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.WaitActive(ctx, 10); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := conns.Close(); err != nil {
		t.Fatal(err)
	}
	// The channel's stream ended with the connection: all ten freed.
	if err := srv.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}

// unaryOnly is a local router of a version without the Channel RPC.
type unaryOnly struct {
	localrouterv1.UnimplementedLocalRouterServer
}

func (unaryOnly) BestWorker(context.Context, *localrouterv1.BestWorkerRequest) (*localrouterv1.BestWorkerResponse, error) {
	return &localrouterv1.BestWorkerResponse{Selection: &localrouterv1.Selection{WorkerId: "old-1", Address: "10.0.0.1:8000", BlockSize: 16}}, nil
}

// A router without the Channel RPC is probed the unary way.
func TestChannelDialerFallsBackToUnary(t *testing.T) {
	ctx := testenv.Context(t)
	g := grpc.NewServer()
	localrouterv1.RegisterLocalRouterServer(g, unaryOnly{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conns := pool.NewConns(pool.ChannelDialer(), pool.CircuitOptions{}, nil)
	t.Cleanup(func() { _ = conns.Close() })
	p := open(t, conns, "p", lis.Addr().String())
	for i := range 2 {
		sel, err := p.Probe(ctx, prompt(t, tokens(64, 3), 16))
		if err != nil || sel.WorkerID != "old-1" {
			t.Errorf("probe %d of a unary-only router = %+v, %v; want old-1", i, sel, err)
		}
	}
}
