package server_test

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
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

// A commit without a worker (decide-and-commit) is bounded like a probe:
// allowed_addresses restrict the choice, excluded_addresses take workers
// out of it (the global router's ejected ones), none left is
// ErrNoAllowedWorker; a commit naming its worker ignores both.
func TestCommitWithoutWorkerAllowedExcluded(t *testing.T) {
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
	for i, tc := range []struct {
		name   string
		worker string // "" : the router chooses
		o      client.CommitOptions
		want   string
	}{
		{"no restriction: the cached worker", "", client.CommitOptions{}, "w-0"},
		{"the cached worker excluded (and w-2)", "", client.CommitOptions{ExcludedAddresses: []string{ws[0].Address, ws[2].Address}}, "w-1"},
		{"allowed less excluded", "", client.CommitOptions{AllowedAddresses: []string{ws[0].Address, ws[2].Address}, ExcludedAddresses: []string{ws[0].Address}}, "w-2"},
		{"a named worker ignores both", "w-0", client.CommitOptions{AllowedAddresses: []string{ws[1].Address}, ExcludedAddresses: []string{ws[0].Address}}, "w-0"},
	} {
		answer := make(chan error, 1)
		var got string
		tr, err := c.CommitAsyncWith(ctx, fmt.Sprint("r", i), localrouter.WorkerKey{ID: tc.worker}, client.TokenPrompt(tokens), tc.o, func(sel routing.Selection, err error) {
			got = sel.WorkerID
			answer <- err
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := <-answer; err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: chose %s, want %s", tc.name, got, tc.want)
		}
		if err := tr.Free(ctx); err != nil {
			t.Fatal(err)
		}
	}
	answer := make(chan error, 1)
	tr, err := c.CommitAsyncWith(ctx, "none", localrouter.WorkerKey{}, client.TokenPrompt(tokens),
		client.CommitOptions{AllowedAddresses: []string{ws[1].Address}, ExcludedAddresses: []string{ws[1].Address}},
		func(_ routing.Selection, err error) { answer <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-answer; !errors.Is(err, localrouter.ErrNoAllowedWorker) {
		t.Errorf("none left: got %v, want ErrNoAllowedWorker", err)
	}
	_ = tr.Free(ctx)
	if err := srv.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}
