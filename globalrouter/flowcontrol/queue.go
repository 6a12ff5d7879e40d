package flowcontrol

import (
	"container/heap"
	"container/list"
	"errors"
	"fmt"
	"time"
)

// Refusal reasons (Refused.Reason; the metrics' reason label and the
// 429's x-kvgate-dropped-reason).
const (
	// ReasonQueueFull: the queue (or the request's band) is at its
	// capacity in requests or bytes; refused at the door.
	ReasonQueueFull = "queue_full"
	// ReasonDeadline: the request waited its deadline.
	ReasonDeadline = "queue_deadline"
	// ReasonLate: the request cannot meet its TTFT target: its wait plus
	// its predicted time to first token on the worker it would get is
	// past it (at dispatch, Late; at the door, Request.Need).
	ReasonLate = "queue_late"
	// ReasonClosed: the queue was closed (the router stopping).
	ReasonClosed = "queue_closed"
)

// ErrRefused is matched (errors.Is) by every *Refused.
var ErrRefused = errors.New("flow control refused the request")

// Refused is the error of a request the queue does not serve: at the
// door (queue_full), at its deadline, or when the queue closes.
type Refused struct {
	Reason string
	Band   string
	Msg    string
}

func (r *Refused) Error() string { return "flow control: " + r.Msg }

func (r *Refused) Unwrap() error { return ErrRefused }

// Request is what a queued request is ordered by.
type Request struct {
	// Priority picks the band (Config.Bands).
	Priority int
	// Flow is the request's tenant ("" is one flow of its own).
	Flow string
	// Bytes is the request's size (its body), counted against capacity.
	Bytes int64
	// Wait, when > 0, is the request's TTFT target: it bounds the wait
	// below Config.Deadline, less Need.
	Wait time.Duration
	// Need is the request's predicted service time once dispatched (its
	// predicted time to first token at admission; 0: unknown): a request
	// with a target waits at most Wait − Need, and one whose target is
	// below it is refused at the door (queue_late).
	Need time.Duration
	// Value is the caller's (the live queue's waiter, the replay's
	// request index).
	Value any
}

// Late is the refusal of r at dispatch when, having waited waited, its
// predicted time to first token on the worker it got (ttft) would take
// it past its target (r.Wait): deadline-aware dispatch, so that capacity
// goes to requests that can still meet theirs. nil when it can, or r has
// no target. The refusal's Band is left to the caller.
func Late(r *Request, waited, ttft time.Duration) *Refused {
	if r.Wait <= 0 || waited+ttft <= r.Wait {
		return nil
	}
	return &Refused{Reason: ReasonLate, Msg: fmt.Sprintf("waited %v for a saturated pool; with its predicted time to first token (%v) it would miss its target (%v); retry later",
		waited.Round(time.Millisecond), ttft.Round(time.Millisecond), r.Wait)}
}

// Ticket is a request in the queue.
type Ticket struct {
	Request
	// Enqueued is when it entered; Deadline when it is refused.
	Enqueued, Deadline time.Time
	band               *band
	flow               *Flow
	elem               *list.Element // in flow.fifo; nil once out
	hi                 int           // index in Queue.deadlines
}

// Band is the name of the ticket's band.
func (t *Ticket) Band() string { return t.band.cfg.Name }

// Queued reports whether t is still in its queue.
func (t *Ticket) Queued() bool { return t.elem != nil }

// Flow is a tenant's requests in one band, first come first served.
type Flow struct {
	Name string
	fifo list.List
	// pass is the weighted fairness's virtual time; weight its share.
	pass, weight float64
	// ring is the flow's place among its band's active flows.
	ring *list.Element
}

// Len is how many requests of the flow wait.
func (f *Flow) Len() int { return f.fifo.Len() }

type band struct {
	cfg   Band
	flows map[string]*Flow
	fair  Fairness
	n     int
	bytes int64
}

// Queue is the admission queue's core: strict priority bands, fair
// between flows within a band (Fairness), first come first served within
// a flow, bounded in requests and bytes, each request with a deadline. It
// runs nothing by itself (no goroutine, no timer): time is the now its
// callers pass, so the live router (Live) and the replay (virtual time)
// run the same code. Not safe for concurrent use: Live locks around it.
type Queue struct {
	cfg       Config
	bands     []*band
	n         int
	bytes     int64
	deadlines deadlineHeap
}

// New builds a queue of cfg (defaults applied, validated); fairness, when
// set, makes each band's fairness policy (nil: Config.Fairness's).
func New(cfg Config, fairness func(cfg *Config) Fairness) (*Queue, error) {
	cfg.Defaults()
	if ps := cfg.Validate(); len(ps) > 0 {
		errs := make([]error, len(ps))
		for i, p := range ps {
			errs[i] = p
		}
		return nil, errors.Join(errs...)
	}
	if fairness == nil {
		fairness = builtinFairness
	}
	q := &Queue{cfg: cfg}
	for _, b := range cfg.Bands {
		q.bands = append(q.bands, &band{cfg: b, flows: map[string]*Flow{}, fair: fairness(&cfg)})
	}
	return q, nil
}

// Config is the queue's configuration, defaults applied.
func (q *Queue) Config() Config { return q.cfg }

// Len is how many requests wait; Bytes their size.
func (q *Queue) Len() int     { return q.n }
func (q *Queue) Bytes() int64 { return q.bytes }

// Enqueue adds r at now, or refuses it (*Refused, queue_full) when its
// band or the queue is at capacity.
func (q *Queue) Enqueue(now time.Time, r Request) (*Ticket, error) {
	b := q.bands[q.cfg.band(r.Priority)]
	full := func(what string, n int, bytes int64) error {
		return &Refused{Reason: ReasonQueueFull, Band: b.cfg.Name,
			Msg: fmt.Sprintf("%s full (%d requests, %d bytes waiting); retry later", what, n, bytes)}
	}
	switch {
	case q.n+1 > q.cfg.Capacity.Requests || q.bytes+r.Bytes > q.cfg.Capacity.Bytes:
		return nil, full("the queue is", q.n, q.bytes)
	case b.cfg.Requests > 0 && b.n+1 > b.cfg.Requests, b.cfg.Bytes > 0 && b.bytes+r.Bytes > b.cfg.Bytes:
		return nil, full("band "+b.cfg.Name+" is", b.n, b.bytes)
	}
	wait := q.cfg.Deadline
	if r.Wait > 0 {
		w := r.Wait - max(r.Need, 0)
		if w <= 0 {
			return nil, &Refused{Reason: ReasonLate, Band: b.cfg.Name,
				Msg: fmt.Sprintf("its predicted time to first token (%v) is past its target (%v) on every saturated pool; retry later",
					r.Need.Round(time.Millisecond), r.Wait)}
		}
		wait = min(wait, w)
	}
	t := &Ticket{Request: r, Enqueued: now, Deadline: now.Add(wait), band: b}
	f := b.flows[r.Flow]
	if f == nil {
		f = &Flow{Name: r.Flow, weight: 1}
		if w, ok := q.cfg.Weights[r.Flow]; ok {
			f.weight = w
		}
		b.flows[r.Flow] = f
		b.fair.Activate(f)
	}
	t.flow = f
	t.elem = f.fifo.PushBack(t)
	b.n++
	b.bytes += r.Bytes
	q.n++
	q.bytes += r.Bytes
	heap.Push(&q.deadlines, t)
	return t, nil
}

// Ahead is how many requests wait in priority p's band and the bands
// above it: those a request of p must not overtake.
func (q *Queue) Ahead(p int) int {
	n := 0
	for i := range q.cfg.band(p) + 1 {
		n += q.bands[i].n
	}
	return n
}

// Peek returns the request to serve next, nil when none waits: the
// highest band's, the flow its fairness policy names, that flow's oldest.
func (q *Queue) Peek() *Ticket {
	for _, b := range q.bands {
		if b.n > 0 {
			return b.fair.Next().fifo.Front().Value.(*Ticket)
		}
	}
	return nil
}

// Dispatch removes t, served: its flow's turn is used (Fairness.Served).
// t is normally Peek's; a live queue may serve another it tried while a
// higher band's request arrived. False when t was not queued.
func (q *Queue) Dispatch(t *Ticket) bool {
	if !q.remove(t) {
		return false
	}
	t.band.fair.Served(t.flow)
	q.forget(t)
	return true
}

// Cancel removes t unserved (its client went away, or it failed): its
// flow keeps its turn. False when t was not queued.
func (q *Queue) Cancel(t *Ticket) bool {
	if !q.remove(t) {
		return false
	}
	q.forget(t)
	return true
}

// Expire removes and returns the requests whose deadline is at or before
// now, oldest deadline first.
func (q *Queue) Expire(now time.Time) []*Ticket {
	var out []*Ticket
	for len(q.deadlines) > 0 && !q.deadlines[0].Deadline.After(now) {
		t := q.deadlines[0]
		q.Cancel(t)
		out = append(out, t)
	}
	return out
}

// NextDeadline is the earliest deadline of a waiting request (false: none
// waits).
func (q *Queue) NextDeadline() (time.Time, bool) {
	if len(q.deadlines) == 0 {
		return time.Time{}, false
	}
	return q.deadlines[0].Deadline, true
}

// remove takes t out of its flow, band and the deadlines.
func (q *Queue) remove(t *Ticket) bool {
	if t == nil || t.elem == nil {
		return false
	}
	t.flow.fifo.Remove(t.elem)
	t.elem = nil
	heap.Remove(&q.deadlines, t.hi)
	b := t.band
	b.n--
	b.bytes -= t.Bytes
	q.n--
	q.bytes -= t.Bytes
	return true
}

// forget drops t's flow from its band once it is empty.
func (q *Queue) forget(t *Ticket) {
	if f := t.flow; f.fifo.Len() == 0 {
		t.band.fair.Remove(f)
		delete(t.band.flows, f.Name)
	}
}

// BandStats is one band's queue, for metrics and the status page.
type BandStats struct {
	Name     string
	Requests int
	Bytes    int64
	// Flows are the waiting requests per flow.
	Flows map[string]int
}

// Stats returns every band's queue.
func (q *Queue) Stats() []BandStats {
	out := make([]BandStats, len(q.bands))
	for i, b := range q.bands {
		out[i] = BandStats{Name: b.cfg.Name, Requests: b.n, Bytes: b.bytes, Flows: make(map[string]int, len(b.flows))}
		for name, f := range b.flows {
			out[i].Flows[name] = f.fifo.Len()
		}
	}
	return out
}

// deadlineHeap orders tickets by deadline (then arrival).
type deadlineHeap []*Ticket

func (h deadlineHeap) Len() int { return len(h) }
func (h deadlineHeap) Less(i, j int) bool {
	if !h[i].Deadline.Equal(h[j].Deadline) {
		return h[i].Deadline.Before(h[j].Deadline)
	}
	return h[i].Enqueued.Before(h[j].Enqueued)
}
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hi, h[j].hi = i, j
}
func (h *deadlineHeap) Push(x any) {
	t := x.(*Ticket)
	t.hi = len(*h)
	*h = append(*h, t)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return t
}
