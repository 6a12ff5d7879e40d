package client_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

// waitReservations waits for the router to hold want reservations.
func waitReservations(t *testing.T, r *localrouter.Router, want int) {
	t.Helper()
	testenv.Eventually(t, channelWait, func() (string, bool) {
		if got := r.ReservationStats().Held; got != want {
			return fmt.Sprintf("router holds %d reservations, want %d", got, want), false
		}
		return "", true
	})
}

// TestChannelReservations, over a real gRPC Channel: reserving probes of
// one prompt spread over the workers (each sees the ones before it); a
// commit with Reserved confirms a reservation (the request is held once,
// on the reserved worker), Release releases another without an answer
// awaited, and the stream's break releases the rest as it frees its
// requests.
func TestChannelReservations(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	ctx := testenv.Context(t)
	ch := dialT(t, p.addr).Channel(client.ChannelOptions{})
	pr := hashPrompt(t, prompt(0, 256))
	var sels []routing.Selection
	for i := range 4 {
		sel, err := ch.BestWorker(ctx, pr, client.BestWorkerOptions{RequestID: fmt.Sprint("r", i), ReserveTTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		sels = append(sels, sel)
	}
	per := map[string]int{}
	for _, s := range sels {
		per[s.WorkerID]++
	}
	if per["w1"] != 2 || per["w2"] != 2 {
		t.Errorf("4 reserving probes of one prompt placed %v, want 2 and 2", per)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	tr, err := ch.CommitAsyncWith(ctx, "r0", routing.Selected(sels[0]), pr, client.CommitOptions{Reserved: true}, func(sel routing.Selection, err error) {
		defer wg.Done()
		if err != nil || sel.WorkerID != sels[0].WorkerID {
			t.Errorf("confirmation: %+v, %v; want worker %s", sel, err, sels[0].WorkerID)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := ch.Release(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	waitReservations(t, p.router, 2) // r2 and r3
	waitActive(t, p.router, 1+2)     // r0, and the two reservations' loads
	ch.Close()
	waitReservations(t, p.router, 0)
	waitActive(t, p.router, 0)
	if err := tr.Free(ctx); err != nil {
		t.Errorf("Free after the break: %v", err)
	}
	want := localrouter.ReservationStats{Made: 4, Confirmed: 1, Released: 3}
	if got := p.router.ReservationStats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// TestUnaryReservations: the unary BestWorker reserves with a request id
// and reserve_ttl_us (nothing recorded), a Track-stream commit with
// Reserved confirms it, and Client.Release (Free with reservation) releases
// another; releasing one that is gone is NOT_FOUND.
func TestUnaryReservations(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	ctx := testenv.Context(t)
	c := dialT(t, p.addr)
	pr := hashPrompt(t, prompt(0, 256))
	a, err := c.BestWorker(ctx, pr, client.BestWorkerOptions{RequestID: "a", ReserveTTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.BestWorker(ctx, pr, client.BestWorkerOptions{RequestID: "b", ReserveTTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if a.WorkerID == b.WorkerID {
		t.Errorf("two reserving probes of one prompt both chose %s", a.WorkerID)
	}
	if err := c.Release(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "b"); !errors.Is(err, routing.ErrUnknownRequest) {
		t.Errorf("second release: %v, want ErrUnknownRequest", err)
	}
	done := make(chan error, 1)
	tr, err := c.CommitAsyncWith(ctx, "a", routing.Selected(a), pr, client.CommitOptions{Reserved: true}, func(_ routing.Selection, err error) { done <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitReservations(t, p.router, 0)
	waitActive(t, p.router, 1)
	if err := tr.Free(ctx); err != nil {
		t.Fatal(err)
	}
	waitActive(t, p.router, 0)
	if got, want := p.router.ReservationStats(), (localrouter.ReservationStats{Made: 2, Confirmed: 1, Released: 1}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// TestChannelUnansweredConfirm: with CommitOptions.Unanswered a router
// whose hello offers it takes the confirmation as ChannelRequest.confirm:
// nothing answers it (committed is never called), the reservation becomes
// the request on its worker, and the request's Free is answered as a
// commit's. One naming another worker than its reservation's (the caller
// moved the request) releases the reservation and records the request on
// the worker it names.
func TestChannelUnansweredConfirm(t *testing.T) {
	p := startPool("w1", "w2")
	defer p.stop()
	ctx := testenv.Context(t)
	ch := dialT(t, p.addr).Channel(client.ChannelOptions{})
	defer ch.Close()
	pr := hashPrompt(t, prompt(0, 256))
	var sels []routing.Selection
	for i := range 2 {
		sel, err := ch.BestWorker(ctx, pr, client.BestWorkerOptions{RequestID: fmt.Sprint("u", i), ReserveTTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		sels = append(sels, sel)
	}
	unanswered := client.CommitOptions{Reserved: true, Unanswered: true}
	noAnswer := func(sel routing.Selection, err error) {
		t.Errorf("an unanswered confirmation was answered: %+v, %v", sel, err)
	}
	tr, err := ch.CommitAsyncWith(ctx, "u0", routing.Selected(sels[0]), pr, unanswered, noAnswer)
	if err != nil {
		t.Fatal(err)
	}
	wrong := routing.Selected(sels[0]) // u1 reserved the other worker
	if _, err := ch.CommitAsyncWith(ctx, "u1", wrong, pr, unanswered, noAnswer); err != nil {
		t.Fatal(err)
	}
	waitReservations(t, p.router, 0)
	waitActive(t, p.router, 2)
	for _, id := range []string{"u0", "u1"} {
		if w, ok := p.router.Active().Has(id); !ok || w.ID != sels[0].WorkerID {
			t.Errorf("%s on %v (%v), want %s", id, w, ok, sels[0].WorkerID)
		}
	}
	if err := tr.Free(ctx); err != nil {
		t.Fatal(err)
	}
	waitActive(t, p.router, 1)
	want := localrouter.ReservationStats{Made: 2, Confirmed: 1, Released: 1}
	if got := p.router.ReservationStats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}
