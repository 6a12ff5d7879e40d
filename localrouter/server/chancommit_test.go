package server_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// rawChannel opens a Channel stream to a fresh pool's router, reads its
// hello, and returns the stream with a function that blocks the commits
// of request slow (server.SetCommitHook) until it is called.
func rawChannel(t *testing.T, ctx context.Context, slow string) (localrouterv1.LocalRouter_ChannelClient, func()) {
	t.Helper()
	block := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(block) }) }
	t.Cleanup(unblock) // registered before the server's stop: runs first
	server.SetCommitHook(t, func(rid string) {
		if rid == slow {
			<-block
		}
	})
	srv := pooltest.Start(t, "p", 4, pooltest.Workers("w", 2)...)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := localrouterv1.NewLocalRouterClient(conn).Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetHello() == nil {
		t.Fatalf("first message %v, %v; want the hello", m, err)
	}
	return stream, unblock
}

func chanSend(t *testing.T, s localrouterv1.LocalRouter_ChannelClient, m *localrouterv1.ChannelRequest) {
	t.Helper()
	if err := s.Send(m); err != nil {
		t.Fatal(err)
	}
}

// chanRecv reads the next answer and checks it answers message id with a
// selection (ack 0) or the acknowledgement of event ack.
func chanRecv(t *testing.T, s localrouterv1.LocalRouter_ChannelClient, id uint64, ack localrouterv1.TrackEvent) {
	t.Helper()
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("waiting for the answer to message %d: %v", id, err)
	}
	ok := m.GetId() == id && (ack == 0 && m.GetSelection() != nil || ack != 0 && m.GetAcked() == ack)
	if !ok {
		t.Fatalf("got %v, want message %d answered with %v (0: a selection)", m, id, ack)
	}
}

func decideAndCommit(id uint64, rid string) *localrouterv1.ChannelRequest {
	return &localrouterv1.ChannelRequest{Id: id, Msg: &localrouterv1.ChannelRequest_Commit{Commit: &localrouterv1.CommitRequest{
		RequestId: rid, Prompt: &localrouterv1.Prompt{TokenIds: []uint32{1, 2, 3, 4, 5, 6, 7, 8}},
	}}}
}

func chanEvent(id, commitID uint64, ev localrouterv1.TrackEvent) *localrouterv1.ChannelRequest {
	return &localrouterv1.ChannelRequest{Id: id, Msg: &localrouterv1.ChannelRequest_Event{Event: &localrouterv1.ChannelEvent{CommitId: commitID, Event: ev}}}
}

// A free read behind another request's decide-and-commit that has not
// returned (blocked in the router) is applied and acknowledged without
// waiting for it: commits run off the stream's reader (chancommit.go).
// Before, the reader ran the commit and the free waited behind it
// (BENCHMARKS.md, "Per request: frees behind commits").
func TestChannelFreeDoesNotWaitForAnotherCommit(t *testing.T) {
	ctx := testenv.Context(t)
	stream, unblock := rawChannel(t, ctx, "slow")
	chanSend(t, stream, decideAndCommit(1, "fast"))
	chanRecv(t, stream, 1, 0)
	chanSend(t, stream, decideAndCommit(2, "slow"))
	chanSend(t, stream, chanEvent(3, 1, localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE))
	chanSend(t, stream, chanEvent(4, 1, localrouterv1.TrackEvent_TRACK_EVENT_FREE))
	chanRecv(t, stream, 3, localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE)
	chanRecv(t, stream, 4, localrouterv1.TrackEvent_TRACK_EVENT_FREE) // the slow commit still blocked
	unblock()
	chanRecv(t, stream, 2, 0)
}

// A request's events sent right behind its commit, while that commit is
// blocked, are applied after it and in their order: the commit answered
// with its selection, then the prefill-complete and the free acknowledged
// (a free applied first would be "no request committed"). A probe read
// after the events is answered while the commit is still blocked, so the
// events were read before the commit was applied.
func TestChannelEventsFollowTheirCommit(t *testing.T) {
	ctx := testenv.Context(t)
	stream, unblock := rawChannel(t, ctx, "x")
	chanSend(t, stream, decideAndCommit(1, "x"))
	chanSend(t, stream, chanEvent(2, 1, localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE))
	chanSend(t, stream, chanEvent(3, 1, localrouterv1.TrackEvent_TRACK_EVENT_FREE))
	chanSend(t, stream, &localrouterv1.ChannelRequest{Id: 4, Msg: &localrouterv1.ChannelRequest_Probe{Probe: &localrouterv1.ChannelProbe{
		Prompt: &localrouterv1.Prompt{TokenIds: []uint32{1, 2, 3, 4}},
	}}})
	chanRecv(t, stream, 4, 0)
	unblock()
	chanRecv(t, stream, 1, 0)
	chanRecv(t, stream, 2, localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE)
	chanRecv(t, stream, 3, localrouterv1.TrackEvent_TRACK_EVENT_FREE)
	// A message id naming a request committed and not freed is refused.
	chanSend(t, stream, decideAndCommit(5, "y"))
	chanRecv(t, stream, 5, 0)
	chanSend(t, stream, decideAndCommit(5, "z"))
	if m, err := stream.Recv(); err != nil || m.GetId() != 5 || m.GetError() == nil {
		t.Fatalf("reused message id: got %v, %v; want an error answer", m, err)
	}
}
