package server_test

import (
	"errors"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// BestWorkerRequest.allowed_addresses: the best allowed worker wins over a
// better one outside the list; a host without a port allows its workers;
// a list naming none of the pool's workers is FAILED_PRECONDITION
// NO_ALLOWED_WORKER, which the client unwraps to ErrNoAllowedWorker.
func TestBestWorkerAllowedAddresses(t *testing.T) {
	ctx := testenv.Context(t)
	ws := pooltest.Workers("w", 3)
	srv := pooltest.Start(t, "p", 4, ws...)
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	srv.Store(t, "w-0", tokens)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := client.New(conn)
	host, _, _ := net.SplitHostPort(ws[2].Address)
	for _, tc := range []struct {
		name    string
		allowed []string
		want    string
	}{
		{"no restriction: the cached worker", nil, "w-0"},
		{"the cached worker excluded", []string{ws[1].Address}, "w-1"},
		{"a host without a port", []string{" " + host + " "}, "w-2"},
	} {
		sel, err := c.BestWorker(ctx, client.TokenPrompt(tokens), client.BestWorkerOptions{AllowedAddresses: tc.allowed})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if sel.WorkerID != tc.want {
			t.Errorf("%s: chose %s, want %s", tc.name, sel.WorkerID, tc.want)
		}
	}
	_, err = c.BestWorker(ctx, client.TokenPrompt(tokens), client.BestWorkerOptions{AllowedAddresses: []string{"192.0.2.1:1"}})
	if !errors.Is(err, localrouter.ErrNoAllowedWorker) || status.Code(err) != codes.FailedPrecondition {
		t.Errorf("none allowed: got %v (code %v), want ErrNoAllowedWorker, FailedPrecondition", err, status.Code(err))
	}
}
