package pool

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/kvgate/kvgate/api/routing"
)

// DefaultLateCommits bounds a pool's queue of late commits when
// Options.LateCommits is zero.
const DefaultLateCommits = 1024

// LateOutcome is how a late commit (Pool.CommitLate) ended.
type LateOutcome string

// Late commits' outcomes.
const (
	// LateCommitted: a router of the pool answered and recorded it.
	LateCommitted LateOutcome = "late_committed"
	// LateEnded: the request ended before any router of the pool could be
	// reached; there was nothing left to account.
	LateEnded LateOutcome = "ended"
	// LateRefused: a router was reached and refused the commit (the
	// worker left the pool, say).
	LateRefused LateOutcome = "refused"
	// LateDropped: the queue was full (the oldest queued commit is
	// dropped for a new one) or the pool closed: the request runs
	// unaccounted.
	LateDropped LateOutcome = "dropped"
)

// Late-commit delivery retries when no router can be reached: from
// lateRetryMin, doubling, up to lateRetryMax; a probe of the pool that
// succeeds wakes the delivery at once.
const (
	lateRetryMin = 50 * time.Millisecond
	lateRetryMax = time.Second
)

// lateSendTimeout bounds sending one late commit to one router (opening
// its stream if need be). Not the probe deadline: on a starved process
// that deadline is what runs out, and each miss would hold the queue for
// a retry's wait; a router that is gone costs the queue this long per
// attempt, in the background.
const lateSendTimeout = 2 * time.Second

// lateState is where a late commit is.
type lateState int

const (
	lateQueued lateState = iota
	lateSending
	lateSent
	lateDone // ended, dropped, or freed after it was sent
)

// lateCommit is one queued commit and its request's lifecycle so far.
type lateCommit struct {
	cm      Commit
	done    func(LateOutcome)
	state   lateState
	elem    *list.Element
	t       Tracker // lateSent: the commit's stream
	prefill bool    // the first token came before the commit was sent
	freed   bool    // the request ended while the commit was being sent
}

// lateQueue is a Pool's late commits, oldest first. Its mutex guards
// every lateCommit's state too (a leaf lock).
type lateQueue struct {
	mu      sync.Mutex
	q       list.List
	max     int
	running bool          // a delivery goroutine is running
	wake    chan struct{} // a router of the pool answered (capacity 1)
}

// answered tells the late-commit delivery that a router of the pool just
// answered, without blocking.
func (p *Pool) answered() {
	select {
	case p.late.wake <- struct{}{}:
	default:
	}
}

// Late reports how many late commits the pool holds, waiting for a router.
func (p *Pool) Late() int {
	p.late.mu.Lock()
	defer p.late.mu.Unlock()
	return p.late.q.Len()
}

// CommitLate records a request that was sent to cm.WorkerID while no
// router of the pool could be reached (a best-effort decision): the
// commit is queued and sent, oldest first (lateBatch at a time), to a router of the pool
// that can be reached (a probe's success wakes the delivery; otherwise it
// retries from 50 ms, doubling up to 1 s). The returned Tracker is the
// request's lifecycle: PrefillComplete and Free before the commit was sent
// are kept and sent after it, on the same stream, so a request that ended
// first leaves no load behind (its commit is never sent: LateEnded). done
// (nil: nobody listens) is called once with the outcome; it must not
// block.
//
// A router of the pool is tried whatever its circuit's state (sendLate).
//
// The queue is bounded (Options.LateCommits, DefaultLateCommits): when it
// is full the oldest queued commit is dropped (LateDropped) — the request
// that has run longest, nearest its end — so a router dead for minutes
// holds at most that many commits, each the size of its prompt's hashes.
func (p *Pool) CommitLate(cm Commit, done func(LateOutcome)) Tracker {
	if done == nil {
		done = func(LateOutcome) {}
	}
	lc := &lateCommit{cm: cm, done: done}
	var dropped *lateCommit
	p.late.mu.Lock()
	p.mu.Lock()
	closing := p.closing
	p.mu.Unlock()
	if closing {
		p.late.mu.Unlock()
		lc.state = lateDone
		done(LateDropped)
		return &lateTracker{p: p, lc: lc}
	}
	if p.late.q.Len() >= p.late.max {
		dropped = p.late.q.Remove(p.late.q.Front()).(*lateCommit)
		dropped.state, dropped.elem = lateDone, nil
	}
	lc.elem = p.late.q.PushBack(lc)
	start := !p.late.running
	if start {
		p.late.running = true
		p.mu.Lock()
		if p.closing {
			start = false
			p.late.running = false
		} else {
			p.wg.Add(1)
		}
		p.mu.Unlock()
	}
	p.late.mu.Unlock()
	if dropped != nil {
		dropped.done(LateDropped)
	}
	if start {
		go p.deliverLate()
	}
	return &lateTracker{p: p, lc: lc}
}

// lateBatch is how many late commits are sent at once: one slow send (a
// starved process, a router's stream busy) does not hold the others.
const lateBatch = 32

// deliverLate sends the queued late commits, oldest first, up to
// lateBatch at a time, until none is left or the pool closes (which drops
// the rest). A commit that could not be sent goes back to the front, in
// order, and the delivery waits for a router to answer.
func (p *Pool) deliverLate() {
	defer p.wg.Done()
	wait := lateRetryMin
	for {
		p.late.mu.Lock()
		var batch []*lateCommit
		for len(batch) < lateBatch {
			front := p.late.q.Front()
			if front == nil {
				break
			}
			lc := front.Value.(*lateCommit)
			p.late.q.Remove(front)
			lc.elem, lc.state = nil, lateSending
			batch = append(batch, lc)
		}
		if len(batch) == 0 {
			p.late.running = false
			p.late.mu.Unlock()
			return
		}
		p.late.mu.Unlock()

		sent := make([]bool, len(batch))
		var wg sync.WaitGroup
		for i, lc := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent[i] = p.sendLate(lc)
			}()
		}
		wg.Wait()
		// Those not sent go back in front, in order; one whose request
		// ended meanwhile is done.
		var ended []*lateCommit
		failed := false
		p.late.mu.Lock()
		for i := len(batch) - 1; i >= 0; i-- {
			if sent[i] {
				continue
			}
			failed = true
			lc := batch[i]
			if lc.freed {
				lc.state = lateDone
				ended = append(ended, lc)
				continue
			}
			lc.state = lateQueued
			lc.elem = p.late.q.PushFront(lc)
		}
		p.late.mu.Unlock()
		for _, lc := range ended {
			lc.done(LateEnded)
		}
		if !failed {
			wait = lateRetryMin
			continue
		}
		timer := time.NewTimer(wait)
		select {
		case <-p.life.Done():
			timer.Stop()
			p.dropLate()
			return
		case <-p.late.wake:
			timer.Stop()
		case <-timer.C:
		}
		wait = min(2*wait, lateRetryMax)
	}
}

// sendLate sends lc's commit to a router of the pool; false when none
// could be reached (lc is then lateSending still, for the caller).
//
// Each router is tried in turn whatever its circuit says: a circuit opens
// on probes that ran late as well as on a router that is gone, and a
// commit is only sent, not waited for, so a router that is up but slow
// (its circuit open because the process is starved) takes it at once. A
// router that is gone fails the send within lateSendTimeout.
func (p *Pool) sendLate(lc *lateCommit) bool {
	committed := func(_ routing.Selection, err error) {
		if err != nil {
			lc.done(LateRefused)
			return
		}
		lc.done(LateCommitted)
	}
	var t Tracker
	for _, c := range *p.routers.Load() {
		ctx, cancel := context.WithTimeout(p.life, lateSendTimeout)
		tr, err := p.CommitAsync(ctx, c.addr, lc.cm, committed)
		cancel()
		if err == nil {
			t = tr
			break
		}
	}
	if t == nil {
		return false
	}
	p.late.mu.Lock()
	lc.state, lc.t = lateSent, t
	prefill, freed := lc.prefill, lc.freed
	if freed {
		lc.state = lateDone
	}
	p.late.mu.Unlock()
	// Events follow the commit on its stream, in order: a free that came
	// while it was being sent goes after it. Their acknowledgements are
	// waited for off the batch: the next batch must not wait for them (a
	// round trip each on a starved process, which held up to 146 commits
	// queued under two CPU hogs; BENCHMARKS.md "Per request").
	if freed || prefill {
		p.wg.Add(1) // the delivery's own count is held: Close waits for this too
		go func() {
			defer p.wg.Done()
			ectx, ecancel := context.WithTimeout(context.WithoutCancel(p.life), p.timeout)
			defer ecancel()
			if freed {
				_ = t.Free(ectx)
			} else {
				_ = t.PrefillComplete(ectx)
			}
		}()
	}
	return true
}

// dropLate drops every queued late commit (the pool closed).
func (p *Pool) dropLate() {
	p.late.mu.Lock()
	var out []*lateCommit
	for e := p.late.q.Front(); e != nil; e = e.Next() {
		lc := e.Value.(*lateCommit)
		lc.state, lc.elem = lateDone, nil
		out = append(out, lc)
	}
	p.late.q.Init()
	p.late.running = false
	p.late.mu.Unlock()
	for _, lc := range out {
		lc.done(LateDropped)
	}
}

// lateTracker is a late commit's Tracker.
type lateTracker struct {
	p  *Pool
	lc *lateCommit
}

func (t *lateTracker) PrefillComplete(ctx context.Context) error {
	q := &t.p.late
	q.mu.Lock()
	if t.lc.state != lateSent {
		t.lc.prefill = true
		q.mu.Unlock()
		return nil
	}
	tr := t.lc.t
	q.mu.Unlock()
	return tr.PrefillComplete(ctx)
}

// Retarget implements LateRetargeter.
func (t *lateTracker) Retarget(workerID string, dpRank uint32) bool {
	q := &t.p.late
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.lc.state != lateQueued {
		return false
	}
	t.lc.cm.WorkerID, t.lc.cm.DPRank = workerID, dpRank
	return true
}

// LateRetargeter is implemented by the Trackers of Pool.CommitLate: while
// the commit is still queued (no router of the pool reached yet), Retarget
// makes it name another worker of the pool — the one the data plane
// reports served the request, when that is not the one decided — and
// reports true; once the commit is being sent, or is sent, or the request
// ended, it changes nothing and reports false (the caller moves the request
// with a commit of its own and a free of this one). Safe for concurrent use
// with the Tracker's other methods and the delivery.
type LateRetargeter interface {
	Retarget(workerID string, dpRank uint32) bool
}

var _ LateRetargeter = (*lateTracker)(nil)

func (t *lateTracker) Free(ctx context.Context) error {
	q := &t.p.late
	q.mu.Lock()
	lc := t.lc
	switch lc.state {
	case lateQueued:
		q.q.Remove(lc.elem)
		lc.state, lc.elem = lateDone, nil
		q.mu.Unlock()
		lc.done(LateEnded)
		return nil
	case lateSending:
		lc.freed = true // the sender frees it once sent
		q.mu.Unlock()
		return nil
	case lateSent:
		lc.state = lateDone
		tr := lc.t
		q.mu.Unlock()
		return tr.Free(ctx)
	}
	q.mu.Unlock()
	return nil
}
