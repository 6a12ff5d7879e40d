package pool_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pool"
)

// TestTrackConnectingBoundedByContext: a router host that accepts TCP but
// never answers (a blackhole) keeps the connection connecting; opening a
// Track stream must give up when the request's context does, not wait
// for gRPC's connect timeout.
func TestTrackConnectingBoundedByContext(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() { // accept and hold connections, never speaking HTTP/2
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	r, err := pool.GRPCDialer()(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	tr, err := r.CommitAsync(ctx, pool.Commit{RequestID: "r", WorkerID: "w", Prompt: pool.Prompt{Tokens: []uint32{1, 2, 3}, BlockSize: 16, ISL: 3}}, nil)
	if err == nil {
		_ = tr.Free(context.Background())
		t.Fatal("Track on a blackholed router succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Track error %v, want the request's deadline", err)
	}
}
