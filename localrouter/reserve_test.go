package localrouter

import (
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
)

// reserveRouter is a router of workers a and b on a clock the test moves,
// in approximate mode (decisions are what the index learns from, so a
// reservation that leaked into it would show).
func reserveRouter(t *testing.T, now *time.Time) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	cfg.UseKVEvents = false
	r, err := New(cfg, Options{Clock: func() time.Time { return *now }, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	r.AddWorker("a", 1)
	r.AddWorker("b", 1)
	return r
}

// TestReservationSpreadsAndStaysOutOfTheIndex: a reservation's load is
// seen by the next probe (a second identical prompt goes to the other
// worker), the index learns nothing of it, and Confirm turns it into the
// request on the same worker, counted once, the index learning the
// request's blocks then.
func TestReservationSpreadsAndStaysOutOfTheIndex(t *testing.T) {
	now := time.Unix(100, 0)
	r := reserveRouter(t, &now)
	ctx := testenv.Context(t)
	req := Request{Tokens: toks(64, 0)}
	first, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: "r1", ReserveTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n := r.Index().Stats().Entries; n != 0 {
		t.Errorf("index entries after a reservation: %d, want 0", n)
	}
	if l := r.Active().Load(Selected(first)); l.ActiveRequests != 1 || l.PrefillTokens != 64 {
		t.Errorf("reserved worker's load %+v, want 1 request, 64 prefill tokens", l)
	}
	second, err := r.BestWorker(ctx, req, BestWorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if Selected(second) == Selected(first) {
		t.Errorf("a probe after the reservation chose the reserved worker %v again", Selected(first))
	}
	sel, err := r.Confirm(ctx, "r1", Selected(first), req)
	if err != nil {
		t.Fatal(err)
	}
	if Selected(sel) != Selected(first) {
		t.Errorf("confirmed on %v, want the reserved %v", Selected(sel), Selected(first))
	}
	if l := r.Active().Load(Selected(first)); l.ActiveRequests != 1 {
		t.Errorf("after the confirmation %+v, want the one request (the reservation became it)", l)
	}
	if _, held := r.Reserved("r1"); held {
		t.Error("the reservation is still held after its confirmation")
	}
	if n := r.Index().Stats().Entries; n == 0 {
		t.Error("the index learned nothing of the confirmed request (approximate mode)")
	}
	if err := r.Free(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if got, want := r.ReservationStats(), (ReservationStats{Made: 1, Confirmed: 1}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// TestReservationEnds: a reservation ends by Release, by its TTL (counted
// expired, seen by the next probe without a sweep), by a confirmation
// naming another worker (released, the request recorded there), and a
// confirmation that finds none records an ordinary commit (missed). An id
// already active is refused (ErrDuplicateRequest); one already reserved
// is reserved again.
func TestReservationEnds(t *testing.T) {
	now := time.Unix(100, 0)
	r := reserveRouter(t, &now)
	ctx := testenv.Context(t)
	req := Request{Tokens: toks(64, 0)}
	reserve := func(id string) WorkerKey {
		t.Helper()
		sel, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: id, ReserveTTL: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return Selected(sel)
	}
	idle := func(when string) {
		t.Helper()
		for _, w := range []string{"a", "b"} {
			if l := r.Active().Load(WorkerKey{ID: w}); l != (WorkerLoad{}) {
				t.Errorf("%s: worker %s holds %+v, want nothing", when, w, l)
			}
		}
	}

	reserve("released")
	reserve("released") // again: the first is released, the second holds
	if rs := r.ReservationStats(); rs.Held != 1 || rs.Released != 1 {
		t.Errorf("after reserving an id twice: %+v, want 1 held, 1 released", rs)
	}
	if err := r.Release(ctx, "released"); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "released"); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("second release: %v, want ErrUnknownRequest", err)
	}
	idle("after the release")

	reserve("expires")
	now = now.Add(49 * time.Millisecond)
	if _, held := r.Reserved("expires"); !held {
		t.Error("the reservation ended before its TTL")
	}
	now = now.Add(time.Millisecond)
	if _, err := r.BestWorker(ctx, req, BestWorkerOptions{}); err != nil { // a probe expires it
		t.Fatal(err)
	}
	idle("after the TTL")

	w := reserve("moved")
	other := WorkerKey{ID: "a"}
	if w == other {
		other = WorkerKey{ID: "b"}
	}
	if _, err := r.Confirm(ctx, "moved", other, req); err != nil {
		t.Fatal(err)
	}
	if l := r.Active().Load(w); l.ActiveRequests != 0 {
		t.Errorf("the reserved worker %v still holds %+v after the request moved", w, l)
	}
	if l := r.Active().Load(other); l.ActiveRequests != 1 {
		t.Errorf("worker %v holds %+v, want the moved request", other, l)
	}
	if _, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: "moved", ReserveTTL: time.Second}); !errors.Is(err, ErrDuplicateRequest) {
		t.Errorf("reserving an active id: %v, want ErrDuplicateRequest", err)
	}
	if err := r.Free(ctx, "moved"); err != nil {
		t.Fatal(err)
	}

	if _, err := r.Confirm(ctx, "never", WorkerKey{ID: "a"}, req); err != nil {
		t.Fatal(err)
	}
	if err := r.Free(ctx, "never"); err != nil {
		t.Fatal(err)
	}
	idle("at the end")
	want := ReservationStats{Made: 4, Released: 3, Expired: 1, Missed: 1}
	if got := r.ReservationStats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// TestSweepExpiresReservations: the sweeper expires reservations too,
// when no probe comes.
func TestSweepExpiresReservations(t *testing.T) {
	now := time.Unix(100, 0)
	r := reserveRouter(t, &now)
	ctx := testenv.Context(t)
	if _, err := r.BestWorker(ctx, Request{Tokens: toks(64, 0)}, BestWorkerOptions{RequestID: "x", ReserveTTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	r.Sweep()
	if rs := r.ReservationStats(); rs.Expired != 1 || rs.Held != 0 {
		t.Errorf("after the sweep %+v, want 1 expired, none held", rs)
	}
}

// TestReservationHeldAndReplaced: a reserving probe's answer counts the
// other requests' reservations held (ReservationsHeld, never its own); a
// decide-and-commit of a reserved request replaces its reservation (the
// request counted once); ConfirmHeld, with no prompt, turns a reservation
// into its request and the index learns its blocks, and one naming
// another worker releases the reservation and records the request there.
func TestReservationHeldAndReplaced(t *testing.T) {
	now := time.Unix(100, 0)
	r := reserveRouter(t, &now)
	ctx := testenv.Context(t)
	req := Request{Tokens: toks(64, 0)}
	var sels []routing.Selection
	for i, id := range []string{"r1", "r2", "r2"} {
		sel, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: id, ReserveTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if want := min(i, 1); sel.ReservationsHeld != want {
			t.Errorf("probe %d (%s): %d reservations held, want %d", i, id, sel.ReservationsHeld, want)
		}
		sels = append(sels, sel)
	}
	if _, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: "r2"}); err != nil {
		t.Fatal(err)
	}
	if rs := r.ReservationStats(); rs.Held != 1 || r.Active().Stats().Requests != 2 {
		t.Errorf("after r2's decide-and-commit: %+v, %d requests; want r1's reservation and r2: 2", rs, r.Active().Stats().Requests)
	}
	other := Selected(sels[0])
	other.ID = map[string]string{"a": "b", "b": "a"}[other.ID]
	if err := r.ConfirmHeld(ctx, "r1", other); err != nil {
		t.Errorf("ConfirmHeld on another worker: %v", err)
	}
	if got, ok := r.Active().Has("r1"); !ok || got != other {
		t.Errorf("r1 on %v (%v), want the worker its confirmation named, %v", got, ok, other)
	}
	if _, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: "r3", ReserveTTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	entries := r.Index().Stats().Entries
	w, _ := r.Reserved("r3")
	if err := r.ConfirmHeld(ctx, "r3", w); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Active().Has("r3"); !ok || got != w {
		t.Errorf("r3 on %v (%v), want %v", got, ok, w)
	}
	if r.Index().Stats().Entries <= entries {
		t.Errorf("the index learnt nothing of r3's confirmation (%d entries)", entries)
	}
	rs := r.ReservationStats()
	if rs.Held != 0 || rs.Missed != 0 || rs.Confirmed != 1 || rs.Released != 3 || r.Active().Stats().Requests != 3 {
		t.Errorf("stats %+v, %d requests; want none held or missed, 1 confirmed, 3 released (r2 twice, r1 moved), 3 requests", rs, r.Active().Stats().Requests)
	}
}

// TestLateConfirmHeld: an answerless confirmation that comes after its
// reservation expired, within one more TTL, still records the request
// (counted as missed); one later than that records nothing.
func TestLateConfirmHeld(t *testing.T) {
	now := time.Unix(100, 0)
	r := reserveRouter(t, &now)
	ctx := testenv.Context(t)
	req := Request{Tokens: toks(64, 0)}
	var workers []WorkerKey
	for _, id := range []string{"late", "later"} {
		sel, err := r.BestWorker(ctx, req, BestWorkerOptions{RequestID: id, ReserveTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, Selected(sel))
	}
	now = now.Add(1500 * time.Millisecond)
	r.Sweep()
	if rs := r.ReservationStats(); rs.Held != 0 || rs.Expired != 2 || r.Active().Stats().Requests != 0 {
		t.Fatalf("after the TTL: %+v, %d requests; want both expired, nothing held", rs, r.Active().Stats().Requests)
	}
	if err := r.ConfirmHeld(ctx, "late", workers[0]); err != nil {
		t.Fatalf("late confirmation within a TTL of the expiry: %v", err)
	}
	if w, ok := r.Active().Has("late"); !ok || w != workers[0] {
		t.Errorf("late on %v (%v), want %v", w, ok, workers[0])
	}
	now = now.Add(time.Second)
	r.Sweep()
	if err := r.ConfirmHeld(ctx, "later", workers[1]); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("confirmation two TTLs after the reservation: %v, want ErrUnknownRequest", err)
	}
	if rs := r.ReservationStats(); rs.Missed != 2 || r.Active().Stats().Requests != 1 {
		t.Errorf("%+v, %d requests; want 2 missed, 1 request", rs, r.Active().Stats().Requests)
	}
}
