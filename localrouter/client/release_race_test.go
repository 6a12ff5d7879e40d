package client_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestReleaseRightAfterProbe, over a raw Channel stream (gRPC's own
// client, the wire as any client writes it): a release sent right behind
// its reserving probe — a client that stopped waiting for the answer —
// never leaves the reservation held, whether the probe had run when the
// release was read or was still queued on the stream's workers (then the
// probe's reservation is released as soon as it is made, not left to its
// TTL). 200 pairs; each is answered, and none is held at the end.
func TestReleaseRightAfterProbe(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	ctx := testenv.Context(t)
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := localrouterv1.NewLocalRouterClient(conn).Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const pairs = 200
	pr := hashPrompt(t, prompt(0, 256))
	for i := range pairs {
		rid := fmt.Sprint("early-", i)
		probe := &localrouterv1.ChannelRequest{Id: uint64(2*i + 1), Msg: &localrouterv1.ChannelRequest_Probe{Probe: &localrouterv1.ChannelProbe{
			Prompt: &localrouterv1.Prompt{BlockHashes: pr.BlockHashes, BlockSize: 16, IslTokens: 256}, ReserveRequestId: rid, ReserveTtlUs: 10_000_000}}}
		release := &localrouterv1.ChannelRequest{Id: uint64(2*i + 2), Msg: &localrouterv1.ChannelRequest_Release{Release: &localrouterv1.ChannelRelease{RequestId: rid}}}
		if err := st.Send(probe); err != nil {
			t.Fatal(err)
		}
		if err := st.Send(release); err != nil {
			t.Fatal(err)
		}
	}
	answered := 0
	for answered < pairs {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetHello() != nil {
			continue
		}
		if m.GetSelection() == nil {
			t.Fatalf("message %d answered %v, want a selection", m.GetId(), m)
		}
		answered++
	}
	waitReservations(t, p.router, 0)
	if rs := p.router.ReservationStats(); rs.Made != pairs || rs.Released != pairs {
		t.Errorf("stats %+v, want %d made and released", rs, pairs)
	}
}
