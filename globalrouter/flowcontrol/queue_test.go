package flowcontrol_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
)

var t0 = time.Unix(1000, 0)

func newQueue(t *testing.T, cfg flowcontrol.Config) *flowcontrol.Queue {
	t.Helper()
	cfg.Enabled = true
	q, err := flowcontrol.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func enqueue(t *testing.T, q *flowcontrol.Queue, now time.Time, r flowcontrol.Request) *flowcontrol.Ticket {
	t.Helper()
	tk, err := q.Enqueue(now, r)
	if err != nil {
		t.Fatalf("Enqueue(%+v): %v", r, err)
	}
	return tk
}

// drain dispatches every request in order, returning their values.
func drain(q *flowcontrol.Queue) []string {
	var out []string
	for tk := q.Peek(); tk != nil; tk = q.Peek() {
		q.Dispatch(tk)
		out = append(out, tk.Value.(string))
	}
	return out
}

func TestBandsStrict(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{})
	for i, p := range []int{0, 0, 5, 0, 1} {
		enqueue(t, q, t0.Add(time.Duration(i)), flowcontrol.Request{Priority: p, Value: string(rune('a' + i))})
	}
	// Band high (≥ 1) first, in arrival order: c (5), e (1); then the rest.
	if diff := cmp.Diff([]string{"c", "e", "a", "b", "d"}, drain(q)); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}
}

func TestRoundRobinFairnessAndFCFS(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{})
	// Tenant a sends four for each of b's and c's.
	var n int
	add := func(flow string) {
		n++
		enqueue(t, q, t0.Add(time.Duration(n)), flowcontrol.Request{Flow: flow, Value: flow + string(rune('0'+n%10))})
	}
	for range 2 {
		add("a")
		add("a")
		add("a")
		add("a")
		add("b")
		add("c")
	}
	got := drain(q)
	// Turns alternate a, b, c while all wait; each flow in its own order.
	want := []string{"a1", "b5", "c6", "a2", "b1", "c2", "a3", "a4", "a7", "a8", "a9", "a0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}
}

// TestShortestFairness: the flow whose oldest request is the smallest
// goes next; within a flow, first come first served (b's small second
// request waits behind its large first).
func TestShortestFairness(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{Fairness: flowcontrol.FairnessShortest})
	for i, r := range []flowcontrol.Request{
		{Flow: "a", Bytes: 500, Value: "a500"},
		{Flow: "b", Bytes: 900, Value: "b900"},
		{Flow: "b", Bytes: 10, Value: "b10"},
		{Flow: "c", Bytes: 100, Value: "c100"},
		{Flow: "a", Bytes: 50, Value: "a50"},
		{Flow: "d", Bytes: 100, Value: "d100"},
	} {
		enqueue(t, q, t0.Add(time.Duration(i)), r)
	}
	want := []string{"c100", "d100", "a500", "a50", "b900", "b10"}
	if diff := cmp.Diff(want, drain(q)); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}
}

func TestWeightedFairness(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{Fairness: flowcontrol.FairnessWeighted, Weights: map[string]float64{"a": 2}})
	for i := range 6 {
		enqueue(t, q, t0.Add(time.Duration(i)), flowcontrol.Request{Flow: "a", Value: "a"})
		enqueue(t, q, t0.Add(time.Duration(i)), flowcontrol.Request{Flow: "b", Value: "b"})
	}
	got := strings.Join(drain(q)[:6], "")
	// a has twice b's share while both wait.
	if strings.Count(got, "a") != 4 || strings.Count(got, "b") != 2 {
		t.Errorf("first six dispatched %q, want four of a and two of b", got)
	}
}

func TestCapacity(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{
		Capacity: flowcontrol.Capacity{Requests: 3, Bytes: 100},
		Bands:    []flowcontrol.Band{{Name: "high", MinPriority: ptr(1), Requests: 1}, {Name: "low", Bytes: 60}},
	})
	enqueue(t, q, t0, flowcontrol.Request{Priority: 1, Bytes: 10})
	refused := func(r flowcontrol.Request, what string) {
		t.Helper()
		_, err := q.Enqueue(t0, r)
		var rf *flowcontrol.Refused
		if !errors.As(err, &rf) || rf.Reason != flowcontrol.ReasonQueueFull {
			t.Fatalf("%s: got %v, want a queue_full refusal", what, err)
		}
	}
	refused(flowcontrol.Request{Priority: 1}, "the high band's second request")
	enqueue(t, q, t0, flowcontrol.Request{Bytes: 50})
	refused(flowcontrol.Request{Bytes: 11}, "past the low band's 60 bytes")
	enqueue(t, q, t0, flowcontrol.Request{Bytes: 10})
	refused(flowcontrol.Request{}, "a fourth request")
	if q.Len() != 3 || q.Bytes() != 70 {
		t.Errorf("got %d requests of %d bytes, want 3 of 70", q.Len(), q.Bytes())
	}
}

func TestDeadlines(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{Deadline: time.Second})
	a := enqueue(t, q, t0, flowcontrol.Request{Value: "a"})
	b := enqueue(t, q, t0, flowcontrol.Request{Value: "b", Wait: 200 * time.Millisecond}) // its TTFT target
	c := enqueue(t, q, t0.Add(100*time.Millisecond), flowcontrol.Request{Value: "c"})
	if next, _ := q.NextDeadline(); !next.Equal(t0.Add(200 * time.Millisecond)) {
		t.Errorf("next deadline %v, want b's at +200ms", next.Sub(t0))
	}
	if got := q.Expire(t0.Add(199 * time.Millisecond)); len(got) != 0 {
		t.Errorf("expired %d before any deadline", len(got))
	}
	if got := q.Expire(t0.Add(time.Second)); len(got) != 2 || got[0] != b || got[1] != a {
		t.Errorf("expired %v at +1s, want b then a", got)
	}
	if a.Queued() || b.Queued() || !c.Queued() || q.Len() != 1 {
		t.Errorf("after expiry: a %v b %v c %v, %d waiting; want only c", a.Queued(), b.Queued(), c.Queued(), q.Len())
	}
}

func TestCancel(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{})
	a := enqueue(t, q, t0, flowcontrol.Request{Flow: "x", Value: "a", Bytes: 5})
	enqueue(t, q, t0, flowcontrol.Request{Flow: "x", Value: "b"})
	enqueue(t, q, t0, flowcontrol.Request{Flow: "y", Value: "c"})
	if !q.Cancel(a) || q.Cancel(a) {
		t.Fatal("Cancel: want true once, then false")
	}
	if q.Dispatch(a) {
		t.Error("Dispatch of a cancelled ticket: got true")
	}
	if _, ok := q.NextDeadline(); !ok || q.Bytes() != 0 {
		t.Errorf("bytes %d after the cancel, want 0", q.Bytes())
	}
	if diff := cmp.Diff([]string{"b", "c"}, drain(q)); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}
	if _, ok := q.NextDeadline(); ok || q.Len() != 0 {
		t.Error("queue not empty after draining")
	}
	st := q.Stats()
	if st[0].Requests != 0 || len(st[1].Flows) != 0 {
		t.Errorf("stats after draining: %+v", st)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  flowcontrol.Config
		key  string
	}{
		{"last band with min_priority", flowcontrol.Config{Bands: []flowcontrol.Band{{Name: "a", MinPriority: ptr(1)}}}, "bands[0].min_priority"},
		{"bands out of order", flowcontrol.Config{Bands: []flowcontrol.Band{{Name: "a", MinPriority: ptr(1)}, {Name: "b", MinPriority: ptr(2)}, {Name: "c"}}}, "bands[1].min_priority"},
		{"duplicate name", flowcontrol.Config{Bands: []flowcontrol.Band{{Name: "a", MinPriority: ptr(1)}, {Name: "a"}}}, "bands[1].name"},
		{"unknown fairness", flowcontrol.Config{Fairness: "lottery"}, "fairness"},
		{"weights unread by shortest", flowcontrol.Config{Fairness: "shortest", Weights: map[string]float64{"a": 2}}, "weights"},
		{"weights unread", flowcontrol.Config{Weights: map[string]float64{"a": 2}}, "weights"},
		{"bad weight", flowcontrol.Config{Fairness: "weighted", Weights: map[string]float64{"a": -1}}, "weights"},
		{"negative deadline", flowcontrol.Config{Deadline: -time.Second}, "deadline"},
		{"share above 1", flowcontrol.Config{Saturation: flowcontrol.Saturation{LowerBandShare: 1.5}}, "saturation.lower_band_share"},
		{"share in a band", flowcontrol.Config{Bands: []flowcontrol.Band{{Name: "a", MinPriority: ptr(1)}, {Name: "b", Saturation: &flowcontrol.Saturation{LowerBandShare: 0.5}}}}, "bands[1].saturation.lower_band_share"},
		{"bad objective name", flowcontrol.Config{Objectives: []flowcontrol.Objective{{Name: "A B"}}}, "objectives[0].name"},
		{"objective twice", flowcontrol.Config{Objectives: []flowcontrol.Objective{{Name: "a"}, {Name: "a", Priority: 1}}}, "objectives[1].name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Defaults()
			ps := tc.cfg.Validate()
			if len(ps) != 1 || ps[0].Key != tc.key {
				t.Errorf("got %v, want one problem at %s", ps, tc.key)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestSaturationFor: the top band has the queue's mark, the bands below
// lower_band_share of it (a quarter by default, at least a token), a
// band's own saturation replaces either.
func TestSaturationFor(t *testing.T) {
	three := []flowcontrol.Band{{Name: "top", MinPriority: ptr(10)}, {Name: "mid", MinPriority: ptr(1)}, {Name: "rest"}}
	own := []flowcontrol.Band{{Name: "top", MinPriority: ptr(1)}, {Name: "rest", Saturation: &flowcontrol.Saturation{MaxPrefillTokens: 100, MaxDecodeTokens: 7}}}
	for _, tc := range []struct {
		name     string
		cfg      flowcontrol.Config
		priority int
		want     int
	}{
		{"default top", flowcontrol.Config{}, 1, 16384},
		{"default lower", flowcontrol.Config{}, 0, 4096},
		{"share 1: one mark", flowcontrol.Config{Saturation: flowcontrol.Saturation{LowerBandShare: 1}}, 0, 16384},
		{"middle band", flowcontrol.Config{Bands: three}, 5, 4096},
		{"one token stays one", flowcontrol.Config{Saturation: flowcontrol.Saturation{MaxPrefillTokens: 1}}, 0, 1},
		{"not checked stays", flowcontrol.Config{Saturation: flowcontrol.Saturation{MaxPrefillTokens: -1}}, 0, -1},
		{"band's own", flowcontrol.Config{Bands: own}, 0, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Enabled = true
			tc.cfg.Defaults()
			if ps := tc.cfg.Validate(); len(ps) > 0 {
				t.Fatal(ps)
			}
			if got := tc.cfg.SaturationFor(tc.priority).MaxPrefillTokens; got != tc.want {
				t.Errorf("priority %d: max_prefill_tokens %d, want %d", tc.priority, got, tc.want)
			}
		})
	}
}

// A request with a target waits at most its target less its predicted
// service time (Need), and is refused at the door when that is nothing.
func TestDeadlineLessNeed(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{Deadline: time.Second})
	a := enqueue(t, q, t0, flowcontrol.Request{Value: "a", Wait: 500 * time.Millisecond, Need: 300 * time.Millisecond})
	if !a.Deadline.Equal(t0.Add(200 * time.Millisecond)) {
		t.Errorf("deadline +%v, want +200ms (target 500ms less 300ms predicted)", a.Deadline.Sub(t0))
	}
	b := enqueue(t, q, t0, flowcontrol.Request{Value: "b", Need: 300 * time.Millisecond}) // no target
	if !b.Deadline.Equal(t0.Add(time.Second)) {
		t.Errorf("deadline of a request without target +%v, want the configured 1s", b.Deadline.Sub(t0))
	}
	_, err := q.Enqueue(t0, flowcontrol.Request{Value: "c", Wait: 300 * time.Millisecond, Need: 300 * time.Millisecond})
	var rf *flowcontrol.Refused
	if !errors.As(err, &rf) || rf.Reason != flowcontrol.ReasonLate || rf.Band != "default" {
		t.Errorf("request whose target is its predicted TTFT: got %v, want queue_late at the door", err)
	}
	if q.Len() != 2 {
		t.Errorf("%d waiting, want 2", q.Len())
	}
}

func TestLate(t *testing.T) {
	r := &flowcontrol.Request{Wait: time.Second}
	for _, c := range []struct {
		waited, ttft time.Duration
		late         bool
	}{
		{0, time.Second, false},
		{400 * time.Millisecond, 600 * time.Millisecond, false},
		{400 * time.Millisecond, 601 * time.Millisecond, true},
		{time.Second, 0, false},
		{time.Second, time.Nanosecond, true},
	} {
		rf := flowcontrol.Late(r, c.waited, c.ttft)
		if (rf != nil) != c.late {
			t.Errorf("Late(waited %v, ttft %v) = %v, want late %v", c.waited, c.ttft, rf, c.late)
		}
		if rf != nil && (rf.Reason != flowcontrol.ReasonLate || !strings.Contains(rf.Msg, "target")) {
			t.Errorf("Late refusal %+v: want queue_late naming the target", rf)
		}
	}
	if rf := flowcontrol.Late(&flowcontrol.Request{}, time.Hour, time.Hour); rf != nil {
		t.Errorf("request without target refused late: %v", rf)
	}
}

func TestAhead(t *testing.T) {
	q := newQueue(t, flowcontrol.Config{})
	enqueue(t, q, t0, flowcontrol.Request{Priority: 0, Value: "a"})
	enqueue(t, q, t0, flowcontrol.Request{Priority: 0, Value: "b"})
	if q.Ahead(1) != 0 || q.Ahead(0) != 2 {
		t.Errorf("Ahead(1) %d Ahead(0) %d, want 0 (nothing in band high) and 2", q.Ahead(1), q.Ahead(0))
	}
	enqueue(t, q, t0, flowcontrol.Request{Priority: 3, Value: "c"})
	if q.Ahead(1) != 1 || q.Ahead(0) != 3 {
		t.Errorf("Ahead(1) %d Ahead(0) %d, want 1 and 3", q.Ahead(1), q.Ahead(0))
	}
}
