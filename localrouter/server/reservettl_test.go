package server_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// TestReserveTTLBounded: a reserving BestWorker whose reserve_ttl_us is
// over routing.MaxReserveTTL (the router's own bound), on BestWorker and
// the channel alike, is INVALID_ARGUMENT and reserves nothing (an
// anonymous caller could otherwise hold load on a worker for the 71
// minutes a uint32 of microseconds spells); at the bound it reserves.
func TestReserveTTLBounded(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "p", 4, pooltest.Workers("w", 1)...)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := localrouterv1.NewLocalRouterClient(conn)
	prompt := &localrouterv1.Prompt{TokenIds: []uint32{1, 2, 3, 4, 5, 6, 7, 8}}
	max := uint32(routing.MaxReserveTTL.Microseconds())
	_, err = c.BestWorker(ctx, &localrouterv1.BestWorkerRequest{Prompt: prompt, RequestId: "long", ReserveTtlUs: max + 1})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("reserve_ttl_us %d: got %v, want INVALID_ARGUMENT", max+1, err)
	}
	if rs := srv.Router.ReservationStats(); rs.Held != 0 {
		t.Errorf("after the refused probe: %+v, want nothing held", rs)
	}
	if _, err := c.BestWorker(ctx, &localrouterv1.BestWorkerRequest{Prompt: prompt, RequestId: "bounded", ReserveTtlUs: max}); err != nil {
		t.Fatalf("reserve_ttl_us %d: %v", max, err)
	}
	if rs := srv.Router.ReservationStats(); rs.Held != 1 {
		t.Errorf("after a probe at the bound: %+v, want 1 held", rs)
	}

	// The channel's reserving probe: the same bound, the same code.
	st, err := c.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	probe := &localrouterv1.ChannelRequest{Id: 1, Msg: &localrouterv1.ChannelRequest_Probe{Probe: &localrouterv1.ChannelProbe{
		Prompt: prompt, ReserveRequestId: "long-channel", ReserveTtlUs: max + 1}}}
	if err := st.Send(probe); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetHello() != nil {
			continue
		}
		if e := m.GetError(); e == nil || codes.Code(e.GetCode()) != codes.InvalidArgument {
			t.Fatalf("channel probe reserving for %d µs: answered %v, want INVALID_ARGUMENT", max+1, m)
		}
		break
	}
	if rs := srv.Router.ReservationStats(); rs.Held != 1 {
		t.Errorf("after the refused channel probe: %+v, want only the bounded one held", rs)
	}
}
