package pool_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
)

// slowRouter is a fake local router (the one seam it replaces: a router
// whose answers come after the caller's deadline, as they do when the
// caller's host is starved of CPU) that answers late for the first `late`
// probes, then in time.
type slowRouter struct {
	localrouterv1.UnimplementedLocalRouterServer
	late  int64
	calls atomic.Int64
}

func (s *slowRouter) BestWorker(ctx context.Context, _ *localrouterv1.BestWorkerRequest) (*localrouterv1.BestWorkerResponse, error) {
	if s.calls.Add(1) <= s.late {
		<-ctx.Done() // answers after the deadline
		return nil, ctx.Err()
	}
	return &localrouterv1.BestWorkerResponse{Selection: &localrouterv1.Selection{WorkerId: "w-0", Address: "10.0.0.1:8000", BlockSize: 16, Candidates: 1}}, nil
}

func startSlow(t *testing.T, late int64) (*slowRouter, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &slowRouter{late: late}
	g := grpc.NewServer()
	localrouterv1.RegisterLocalRouterServer(g, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return s, lis.Addr().String()
}

// TestSlowProbesKeepCircuitClosed: probes that miss their deadline (here
// 30 ms, fixed) fewer times in a row than the timeout rule allows leave
// the circuit closed, and the router keeps being probed: the next probe in
// time answers. Only the rule's count of timeouts in a row opens it.
func TestSlowProbesKeepCircuitClosed(t *testing.T) {
	ctx := testenv.Context(t)
	const timeouts = 6
	opts := pool.CircuitOptions{Base: time.Minute, Max: time.Minute, Failures: 3, Timeouts: timeouts}
	open := func(addr string) *pool.Pool {
		p, err := pool.Open(pool.NewConfig("p", 16, []string{"m"}, addr), pool.Options{
			Conns: newConns(t, nil, opts), ProbeTimeout: 30 * time.Millisecond, ProbeMinTimeout: 30 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	pr := prompt(t, tokens(40, 1), 16)

	// timeouts-1 late answers, then one in time: closed throughout.
	_, addr := startSlow(t, timeouts-1)
	p := open(addr)
	for i := range timeouts - 1 {
		_, err := p.Probe(ctx, pr)
		var pe *pool.ProbeError
		if !errors.As(err, &pe) || !pe.Timeout || pe.Backoff != 0 {
			t.Fatalf("late probe %d: got %v, want a timeout that opens nothing", i+1, err)
		}
		if st := p.Routers()[0].State; st != pool.CircuitClosed {
			t.Fatalf("after late probe %d: circuit %v, want closed", i+1, st)
		}
	}
	if sel, err := p.Probe(ctx, pr); err != nil || sel.WorkerID != "w-0" {
		t.Fatalf("probe in time after %d late ones: %+v, %v", timeouts-1, sel, err)
	}

	// A router that keeps answering late: the circuit opens on the
	// timeouts-th timeout counted against it (timeouts the global router
	// caused itself, starved, are not counted).
	_, addr = startSlow(t, 1<<30)
	p = open(addr)
	counted := 0
	for {
		_, err := p.Probe(ctx, pr)
		var pe *pool.ProbeError
		if !errors.As(err, &pe) || !pe.Timeout {
			t.Fatalf("probe of a late router: got %v, want a timeout", err)
		}
		if !pe.Local {
			counted++
		}
		if pe.Backoff > 0 {
			break
		}
		if counted >= timeouts {
			t.Fatalf("%d timeouts counted and the circuit is still %v", counted, p.Routers()[0].State)
		}
	}
	if counted != timeouts {
		t.Errorf("the circuit opened after %d counted timeouts, want %d", counted, timeouts)
	}
	if _, err := p.Probe(ctx, pr); !errors.Is(err, pool.ErrCircuitOpen) {
		t.Errorf("probe with the circuit open: got %v, want ErrCircuitOpen", err)
	}
}
