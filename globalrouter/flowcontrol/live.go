package flowcontrol

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrSaturated is what a Try returns when the request's pools are still
// saturated: it stays at the head of its flow and the queue waits for the
// next trigger.
var ErrSaturated = errors.New("still saturated")

// Try attempts a queued request at dispatch time (the decision made
// against fresh probes): nil when it went (the caller keeps what it
// decided), ErrSaturated to wait on, any other error to end the request
// with it (a *Refused, Late's, is counted a refusal). It runs on the queue's goroutine with the waiter's context.
type Try func(ctx context.Context) error

// Live runs a Queue on the wall clock: one goroutine dispatches, from the
// highest band, when Kick says a pool may have room (a request of this
// router freed or finished its prefill) and every Reprobe tick (frees
// seen by other routers), and refuses requests at their deadline. Safe
// for concurrent use. Lock order: Live.mu only (Try runs outside it).
type Live struct {
	mu sync.Mutex
	q  *Queue
	// n is q.Len(), stored under mu at each change: Len reads it without
	// the lock (every decision of the queue's pools asks).
	n atomic.Int64
	// kicks counts Kick's calls: a request whose own decision found its
	// pools saturated (WaitAfter) was maybe freed room for before it
	// joined the queue, by a Kick that found the queue empty.
	kicks atomic.Uint64
	now   func() time.Time
	m     *Metrics
	kick  chan struct{}
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	close sync.Once
}

// waiter is a request waiting in a Live queue; state is guarded by
// Live.mu.
type waiter struct {
	ctx   context.Context
	try   Try
	undo  func()
	state int
	out   chan error // buffered: the outcome, sent once
}

const (
	waiting  = iota
	trying   // the dispatcher runs its Try
	finished // its outcome is sent
	gone     // its client left; the dispatcher undoes a success
)

// NewLive starts a live queue of cfg; now is its clock (nil: time.Now),
// m its metrics (nil: none). Close stops it.
func NewLive(cfg Config, now func() time.Time, m *Metrics) (*Live, error) {
	q, err := New(cfg, nil)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	l := &Live{q: q, now: now, m: m, kick: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l, nil
}

// Config is the queue's configuration, defaults applied.
func (l *Live) Config() Config { return l.q.cfg }

// Wait queues r until try lets it go (nil), the queue refuses it
// (*Refused: queue_full at the door, queue_deadline, queue_closed), try
// fails, or ctx ends (ctx.Err(), at once: it leaves the queue). undo is
// called when try let the request go after its client left (free what
// try took).
func (l *Live) Wait(ctx context.Context, r Request, try Try, undo func()) error {
	return l.WaitAfter(ctx, r, l.Kicks(), try, undo)
}

// WaitAfter is Wait for a request whose pools were found saturated when
// Kicks was seen: a Kick since (a lease freed room while the request
// decided, and found the queue empty) dispatches at once rather than at
// the next Kick or re-probe tick.
func (l *Live) WaitAfter(ctx context.Context, r Request, seen uint64, try Try, undo func()) error {
	w := &waiter{ctx: ctx, try: try, undo: undo, out: make(chan error, 1)}
	r.Value = w
	l.mu.Lock()
	t, err := l.q.Enqueue(l.now(), r)
	if err != nil {
		l.mu.Unlock()
		var rf *Refused
		if errors.As(err, &rf) {
			l.m.refused(rf.Band, rf.Reason)
		}
		return err
	}
	l.m.enqueued(t)
	l.counted()
	l.mu.Unlock()
	if l.kicks.Load() != seen {
		signal(l.kick) // room freed while it decided: try it now
	}
	signal(l.wake) // its deadline may be the earliest
	select {
	case err := <-w.out:
		return err
	case <-ctx.Done():
	}
	l.mu.Lock()
	switch w.state {
	case waiting:
		l.q.Cancel(t)
		l.counted()
		l.m.left(t, "cancelled", l.now())
		w.state = gone
	case trying:
		w.state = gone
	case finished:
		l.mu.Unlock()
		return <-w.out // decided as it left: the caller sees the outcome
	}
	l.mu.Unlock()
	return ctx.Err()
}

// Ahead is how many requests wait in priority p's band and above
// (Queue.Ahead).
func (l *Live) Ahead(p int) int {
	if l.Len() == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.q.Ahead(p)
}

// Len is how many requests wait.
func (l *Live) Len() int { return int(l.n.Load()) }

// counted stores the queue's length for Len; called with mu held.
func (l *Live) counted() { l.n.Store(int64(l.q.Len())) }

// Kick asks for a dispatch: a pool may have room. It never blocks.
func (l *Live) Kick() {
	l.kicks.Add(1)
	signal(l.kick)
}

// Kicks is how many times Kick was called (WaitAfter's seen).
func (l *Live) Kicks() uint64 { return l.kicks.Load() }

// Stats returns every band's queue.
func (l *Live) Stats() []BandStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.q.Stats()
}

// Close refuses every waiting request (queue_closed) and stops the
// queue's goroutine, waiting for it.
func (l *Live) Close() {
	l.close.Do(func() { close(l.stop) })
	<-l.done
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (l *Live) run() {
	defer close(l.done)
	// The tick runs only while requests wait: an idle queue sleeps.
	tick := time.NewTicker(l.q.cfg.Reprobe)
	tick.Stop()
	ticking := false
	defer tick.Stop()
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	for {
		l.mu.Lock()
		next, ok := l.q.NextDeadline()
		l.mu.Unlock()
		if ok {
			expiry.Reset(max(next.Sub(l.now()), 0))
		} else {
			expiry.Stop()
		}
		switch {
		case ok && !ticking:
			tick.Reset(l.q.cfg.Reprobe)
		case !ok && ticking:
			tick.Stop()
		}
		ticking = ok
		select {
		case <-l.stop:
			l.closeAll()
			return
		case <-l.kick:
			l.dispatch()
		case <-tick.C:
			l.dispatch()
		case <-expiry.C:
			l.expire()
		case <-l.wake:
		}
	}
}

// dispatch tries the head until one is still saturated or none waits.
func (l *Live) dispatch() {
	for {
		l.expire()
		l.mu.Lock()
		t := l.q.Peek()
		if t == nil {
			l.mu.Unlock()
			return
		}
		w := t.Value.(*waiter)
		w.state = trying
		l.mu.Unlock()
		err := w.try(w.ctx)
		l.mu.Lock()
		now := l.now()
		switch {
		case w.state == gone:
			l.q.Cancel(t)
			l.counted()
			l.m.left(t, "cancelled", now)
			l.m.tried(t.Band(), "cancelled")
			l.mu.Unlock()
			if err == nil && w.undo != nil {
				w.undo()
			}
			continue
		case errors.Is(err, ErrSaturated):
			w.state = waiting
			l.m.tried(t.Band(), "saturated")
			l.mu.Unlock()
			return
		case err == nil:
			l.q.Dispatch(t)
			l.m.left(t, "dispatched", now)
			l.m.tried(t.Band(), "dispatched")
		default:
			l.q.Cancel(t)
			var rf *Refused
			if errors.As(err, &rf) { // Late: refused at dispatch
				if rf.Band == "" {
					rf.Band = t.Band()
				}
				l.m.left(t, "deadline", now)
				l.m.refused(t.Band(), rf.Reason)
				l.m.tried(t.Band(), "late")
			} else {
				l.m.left(t, "failed", now)
				l.m.tried(t.Band(), "failed")
			}
		}
		l.counted()
		w.state = finished
		w.out <- err
		l.mu.Unlock()
	}
}

// expire refuses the requests past their deadline.
func (l *Live) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	defer l.counted()
	for _, t := range l.q.Expire(now) {
		l.m.left(t, "deadline", now)
		l.m.refused(t.Band(), ReasonDeadline)
		w := t.Value.(*waiter)
		w.state = finished
		w.out <- &Refused{Reason: ReasonDeadline, Band: t.Band(), Msg: "waited " + now.Sub(t.Enqueued).Round(time.Millisecond).String() + " for a saturated pool, its deadline; retry later"}
	}
}

// closeAll refuses every waiting request.
func (l *Live) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	defer l.counted()
	for t := l.q.Peek(); t != nil; t = l.q.Peek() {
		l.q.Cancel(t)
		l.m.left(t, "closed", now)
		l.m.refused(t.Band(), ReasonClosed)
		w := t.Value.(*waiter)
		w.state = finished
		w.out <- &Refused{Reason: ReasonClosed, Band: t.Band(), Msg: "the router is stopping; retry"}
	}
}
