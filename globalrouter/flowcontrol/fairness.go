package flowcontrol

import "container/list"

// Fairness shares one band between its flows. A band calls Activate when
// a flow gets its first waiting request, Next for the flow to serve (only
// while one is active), Served when that flow's request was dispatched,
// and Remove when a flow has no request left. Not safe for concurrent use
// (the Queue's caller serialises).
type Fairness interface {
	Activate(f *Flow)
	Next() *Flow
	Served(f *Flow)
	Remove(f *Flow)
}

// builtinFairness is the fairness of cfg.Fairness.
func builtinFairness(cfg *Config) Fairness {
	switch cfg.Fairness {
	case FairnessWeighted:
		return &Weighted{}
	case FairnessShortest:
		return &Shortest{}
	}
	return &RoundRobin{}
}

// RoundRobin serves the active flows in turn, one request each: a tenant
// sending four times the others gets the same share while all wait.
type RoundRobin struct{ ring list.List }

var _ Fairness = (*RoundRobin)(nil)

// Activate implements Fairness: a new flow joins at the back.
func (r *RoundRobin) Activate(f *Flow) { f.ring = r.ring.PushBack(f) }

// Next implements Fairness.
func (r *RoundRobin) Next() *Flow { return r.ring.Front().Value.(*Flow) }

// Served implements Fairness: the flow goes to the back.
func (r *RoundRobin) Served(f *Flow) {
	if f.ring != nil {
		r.ring.MoveToBack(f.ring)
	}
}

// Remove implements Fairness.
func (r *RoundRobin) Remove(f *Flow) {
	if f.ring != nil {
		r.ring.Remove(f.ring)
		f.ring = nil
	}
}

// Weighted serves flows in proportion to their weights (stride
// scheduling): each flow's pass advances by 1/weight per request served,
// the lowest pass goes next (the earliest activated on a tie), and a flow
// that becomes active starts at the band's current pass, so waiting
// earns no credit.
type Weighted struct {
	active list.List
	now    float64
}

var _ Fairness = (*Weighted)(nil)

// Activate implements Fairness.
func (w *Weighted) Activate(f *Flow) {
	f.pass = max(f.pass, w.now)
	f.ring = w.active.PushBack(f)
}

// Next implements Fairness.
func (w *Weighted) Next() *Flow {
	var best *Flow
	for e := w.active.Front(); e != nil; e = e.Next() {
		if f := e.Value.(*Flow); best == nil || f.pass < best.pass {
			best = f
		}
	}
	return best
}

// Served implements Fairness.
func (w *Weighted) Served(f *Flow) {
	w.now = f.pass
	f.pass += 1 / f.weight
}

// Remove implements Fairness.
func (w *Weighted) Remove(f *Flow) {
	if f.ring != nil {
		w.active.Remove(f.ring)
		f.ring = nil
	}
}

// Shortest serves, of the active flows, the one whose oldest request is
// the smallest (Request.Bytes: its body, a prompt's size), the earliest
// activated on a tie; within a flow still first come, first served. It
// dispatches by predicted work: under overload more requests are served
// per prefilled token (as shedding does by refusing the longest prompts
// first), and a flow of long prompts waits while shorter heads keep
// coming, up to its requests' deadlines (queue_deadline): no share is
// promised. Not the default (round_robin is).
type Shortest struct{ RoundRobin }

var _ Fairness = (*Shortest)(nil)

// Next implements Fairness.
func (s *Shortest) Next() *Flow {
	var best *Flow
	var size int64
	for e := s.ring.Front(); e != nil; e = e.Next() {
		f := e.Value.(*Flow)
		if b := f.fifo.Front().Value.(*Ticket).Bytes; best == nil || b < size {
			best, size = f, b
		}
	}
	return best
}
