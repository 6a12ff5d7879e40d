package sim

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
)

// flowReplay is the config replay's flow control (Config.FlowControl):
// the global router's own queue (flowcontrol.Queue, one per set of pools
// as live) run in virtual time. A request Decide refuses as saturated
// waits in its queue; a request arriving while others wait joins them;
// every prefill completion and free of a request (the live router's Kick)
// dispatches from the highest band, each dispatch a fresh Decide; a
// request still waiting at its deadline is refused. Decide itself never
// waits here (globalrouter.WithoutFlowQueue).
type flowReplay struct {
	qs map[string]*flowcontrol.Queue
	// kicked: a lease freed or finished its prefill since the last
	// dispatch.
	kicked bool
	// expiry is when an evFlow event is scheduled (zero: none).
	expiry time.Time
}

// queued is a waiting request: its index and what Decide is given.
type queued struct {
	idx  int
	greq *globalrouter.Request
}

// flowLease is a decision's lease that tells the queue a pool may have
// room, as the live router's lease does.
type flowLease struct {
	globalrouter.Lease
	f *flowReplay
}

func (l flowLease) PrefillComplete(ctx context.Context) error {
	l.f.kicked = true
	return l.Lease.PrefillComplete(ctx)
}

func (l flowLease) Free(ctx context.Context) error {
	l.f.kicked = true
	return l.Lease.Free(ctx)
}

// flowConfig is the global router configuration's flow control under the
// replay's --flow-control: the configuration's section when it enables
// one, else the defaults.
func flowConfig(c flowcontrol.Config) flowcontrol.Config {
	if !c.Enabled {
		c = flowcontrol.Config{Enabled: true}
	}
	c.Defaults()
	return c
}

// queue returns key's queue, made on first use.
func (f *flowReplay) queue(r *run, key string) (*flowcontrol.Queue, error) {
	if q := f.qs[key]; q != nil {
		return q, nil
	}
	q, err := flowcontrol.New(r.gr.Config().FlowControl, nil)
	if err != nil {
		return nil, err
	}
	f.qs[key] = q
	return q, nil
}

// waiting reports whether greq joins its queue without a decision of its
// own: others of its band or above wait there (it would overtake them).
func (r *run) flowWaiting(greq *globalrouter.Request) bool {
	if r.flow == nil {
		return false
	}
	fr, key := r.gr.FlowRequest(greq)
	q := r.flow.qs[key]
	return q != nil && q.Ahead(fr.Priority) > 0
}

// flowEnqueue queues request idx, need its predicted service time
// (flowcontrol.Request.Need; 0: unknown); refused at the door, it is
// rejected.
func (r *run) flowEnqueue(idx int, greq *globalrouter.Request, need time.Duration) error {
	fr, key := r.gr.FlowRequest(greq)
	fr.Need = need
	q, err := r.flow.queue(r, key)
	if err != nil {
		return err
	}
	fr.Value = queued{idx: idx, greq: greq}
	if _, err := q.Enqueue(r.now, fr); err != nil {
		var rf *flowcontrol.Refused
		if !errors.As(err, &rf) {
			return err
		}
		r.flowReject(idx, rf.Reason)
		return nil
	}
	r.flowSchedule()
	return nil
}

func (r *run) flowReject(idx int, reason string) {
	r.recs[idx].rejected = true
	r.decideErrors[reason]++
	r.prog.add(1)
}

// flowAfter runs after each event: expiries due, then, when a lease
// moved, dispatches.
func (r *run) flowAfter(ctx context.Context) error {
	if r.flow == nil {
		return nil
	}
	r.flowExpire()
	if r.flow.kicked {
		r.flow.kicked = false
		for _, key := range slices.Sorted(maps.Keys(r.flow.qs)) {
			if err := r.flowDispatch(ctx, r.flow.qs[key]); err != nil {
				return err
			}
		}
	}
	r.flowSchedule()
	return nil
}

// flowDispatch decides for q's head until one is still saturated.
func (r *run) flowDispatch(ctx context.Context, q *flowcontrol.Queue) error {
	for t := q.Peek(); t != nil; t = q.Peek() {
		w := t.Value.(queued)
		d, err := r.gr.Decide(ctx, w.greq)
		switch {
		case errors.Is(err, globalrouter.ErrSaturated):
			return nil
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			q.Cancel(t)
			r.flowReject(w.idx, decideErrorKind(err))
		default:
			// Deadline-aware dispatch, as live (globalrouter.Decide).
			if rf := flowcontrol.Late(&t.Request, r.now.Sub(t.Enqueued), d.TTFT); rf != nil {
				if err := d.Lease.Free(ctx); err != nil {
					return err
				}
				q.Cancel(t)
				r.flowReject(w.idx, rf.Reason)
				continue
			}
			q.Dispatch(t)
			if err := r.placeGlobal(ctx, w.idx, w.greq, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// flowExpire refuses the requests past their deadline.
func (r *run) flowExpire() {
	for _, key := range slices.Sorted(maps.Keys(r.flow.qs)) {
		for _, t := range r.flow.qs[key].Expire(r.now) {
			r.flowReject(t.Value.(queued).idx, flowcontrol.ReasonDeadline)
		}
	}
}

// flowSchedule makes sure an evFlow event comes at the earliest deadline.
func (r *run) flowSchedule() {
	var next time.Time
	for _, q := range r.flow.qs {
		if d, ok := q.NextDeadline(); ok && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	if next.IsZero() || !r.flow.expiry.IsZero() && !r.flow.expiry.After(next) && r.flow.expiry.After(r.now) {
		return
	}
	r.flow.expiry = next
	r.push(event{t: next, kind: evFlow})
}
