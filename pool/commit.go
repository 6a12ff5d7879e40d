package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
)

// requestFault reports whether a router's answer blames the request, not
// the router (a malformed or oversized prompt, a reserving probe whose
// request id is already active there): no reason to stop probing that
// router for everyone else.
func requestFault(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.OutOfRange, codes.FailedPrecondition, codes.AlreadyExists:
		return true
	}
	return false
}

// CommitAsync commits a request on the pool, through the router at
// routerAddr when it is still there (the one that answered the probe), and
// returns its lifecycle stream once the commit is sent, without waiting
// for the router's answer: committed (nil: nobody listens) is called once,
// from another goroutine, with the answer (see Client.CommitAsync). The
// Tracker must be freed, a refused commit's too. An error means nothing
// was committed.
func (p *Pool) CommitAsync(ctx context.Context, routerAddr string, cm Commit, committed func(routing.Selection, error)) (Tracker, error) {
	c, picked, err := p.pickForCommit(routerAddr)
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", p.cfg.Name, err)
	}
	p.conns.ref(c)
	t, err := c.r.CommitAsync(ctx, cm, func(sel routing.Selection, err error) {
		if committed == nil {
			return
		}
		if err != nil {
			err = fmt.Errorf("pool %q: commit on %s: %w", p.cfg.Name, c.addr, err)
		} else {
			sel.Router = c.addr
			p.answered()
		}
		committed(sel, err)
	})
	if err != nil {
		if picked { // the call went through the circuit: report how it went
			switch {
			case ctx.Err() != nil:
				c.circuit.release()
			case timedOut(err):
				c.circuit.failure(outcomeTimeout)
			default:
				c.circuit.failure(outcomeFailure)
			}
		}
		p.conns.release(c)
		return nil, fmt.Errorf("pool %q: commit on %s: %w", p.cfg.Name, c.addr, err)
	}
	if picked {
		c.circuit.success()
	}
	return &tracker{Tracker: t, release: func() { p.conns.release(c) }}, nil
}

// Commit is CommitAsync waiting, within ctx, for the router's answer: it
// returns the worker's selection, or the refusal (nothing is then left
// open). The stream still outlives ctx, until the Tracker is freed.
func (p *Pool) Commit(ctx context.Context, routerAddr string, cm Commit) (Tracker, routing.Selection, error) {
	type answer struct {
		sel routing.Selection
		err error
	}
	ch := make(chan answer, 1)
	t, err := p.CommitAsync(ctx, routerAddr, cm, func(sel routing.Selection, err error) { ch <- answer{sel, err} })
	if err != nil {
		return nil, routing.Selection{}, err
	}
	select {
	case a := <-ch:
		if a.err != nil {
			_ = t.Free(ctx) // the stream has ended: releases the client
			return nil, routing.Selection{}, a.err
		}
		return t, a.sel, nil
	case <-ctx.Done():
		_ = t.Free(ctx) // closes the stream, which frees the request
		return nil, routing.Selection{}, ctx.Err()
	}
}

// ErrOutOfBounds: a decide-and-commit's router chose a worker the request
// may not use (ejected by passive health, outside its subset, or leaving
// the pool): a router older than the commit's bounds on the wire.
var ErrOutOfBounds = errors.New("the router chose a worker outside the request's bounds")

// Decide is a decide-and-commit: it commits cm with no worker named on the
// pool, through the router at routerAddr when it is still there (the one
// that answered the probe), which chooses the worker as its probe would —
// within cm.Prompt.Allowed, with cm.Prompt.Override, never a worker
// passive health ejected (sent as cm.Exclude) — and records the request
// there in the same step, so no other decision can come between the
// choice and the record. Decide waits for the answer within ctx and the
// router's probe deadline, and returns the lifecycle stream and the chosen
// worker (Router set).
//
// Errors: nothing sent, or the router refused (as CommitAsync; a commit
// the router refuses wraps its error, ErrNoAllowedWorker when no worker is
// left); no answer in time (wraps context.DeadlineExceeded while ctx
// lives); an answer outside the bounds (ErrOutOfBounds). The stream is
// then freed, which frees the request had it landed: nothing is left
// open.
func (p *Pool) Decide(ctx context.Context, routerAddr string, cm Commit) (Tracker, routing.Selection, error) {
	cm.WorkerID, cm.DPRank = "", 0
	cm.Exclude = p.ejectedKnown()
	timeout := p.timeout
	for _, c := range *p.routers.Load() {
		if c.addr == routerAddr {
			timeout = c.lat.deadline(p.minTimeout, p.timeout)
			break
		}
	}
	type answer struct {
		sel routing.Selection
		err error
	}
	ch := make(chan answer, 1)
	t, err := p.CommitAsync(ctx, routerAddr, cm, func(sel routing.Selection, err error) { ch <- answer{sel, err} })
	if err != nil {
		return nil, routing.Selection{}, err
	}
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	var a answer
	select {
	case a = <-ch:
	case <-wait.C:
		a.err = fmt.Errorf("pool %q: decide-and-commit: no answer within %v: %w", p.cfg.Name, timeout, context.DeadlineExceeded)
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	if a.err == nil {
		switch {
		case a.sel.Address == "":
			a.err = fmt.Errorf("pool %q: %w: worker %s/%d has no address (leaving the pool)", p.cfg.Name, ErrOutOfBounds, a.sel.WorkerID, a.sel.DPRank)
		case p.ej.Ejected(a.sel.Address):
			a.err = fmt.Errorf("pool %q: %w: worker %s at %s is ejected", p.cfg.Name, ErrOutOfBounds, a.sel.WorkerID, a.sel.Address)
		case !routing.AddressAllowed(cm.Prompt.Allowed, a.sel.Address):
			a.err = fmt.Errorf("pool %q: %w: worker %s at %s is outside the request's subset", p.cfg.Name, ErrOutOfBounds, a.sel.WorkerID, a.sel.Address)
		}
	}
	if a.err != nil {
		// Closes the stream, which frees the request if it landed; the
		// free is sent even when ctx is gone.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
		_ = t.Free(fctx)
		cancel()
		return nil, routing.Selection{}, a.err
	}
	p.known.add(a.sel.WorkerID, a.sel.DPRank, a.sel.Address, time.Now())
	return t, a.sel, nil
}

// Release releases the reservation request id's reserving probe made on
// the pool's router at routerAddr (Prompt.ReserveID), without waiting. A
// router the pool no longer has, or a Client that is no Releaser, leaves
// it to its TTL.
func (p *Pool) Release(ctx context.Context, routerAddr, id string) {
	for _, c := range *p.routers.Load() {
		if c.addr == routerAddr {
			if r, ok := c.r.(Releaser); ok {
				_ = r.Release(ctx, id)
			}
			return
		}
	}
}

// ReleaseOrdered is Release, but the release is handled by the router
// before any message sent to it after ReleaseOrdered returns
// (OrderedReleaser; a Client that is only a Releaser releases without
// that promise).
func (p *Pool) ReleaseOrdered(ctx context.Context, routerAddr, id string) {
	for _, c := range *p.routers.Load() {
		if c.addr == routerAddr {
			switch r := c.r.(type) {
			case OrderedReleaser:
				_ = r.ReleaseOrdered(ctx, id)
			case Releaser:
				_ = r.Release(ctx, id)
			}
			return
		}
	}
}

// ejectedKnown are the addresses of the pool's recently seen workers that
// passive health ejected.
func (p *Pool) ejectedKnown() []string {
	ws := p.known.list(time.Now(), false, p.ej.Ejected)
	if len(ws) == 0 {
		return nil
	}
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.addr
	}
	return out
}

// pickForCommit takes routerAddr when the pool has it, even when its
// circuit is half-open: it just answered. Otherwise (a pinned worker, or
// the prober left discovery) it picks through the circuits, and picked
// says so: the caller must then report the call's outcome to the circuit,
// or a half-open trial taken here would never end.
func (p *Pool) pickForCommit(routerAddr string) (c *conn, picked bool, err error) {
	rs := *p.routers.Load()
	for _, c := range rs {
		if c.addr == routerAddr {
			return c, false, nil
		}
	}
	c, err = p.pick("")
	return c, err == nil, err
}

// tracker releases its client reference once freed.
type tracker struct {
	Tracker
	once    sync.Once
	release func()
}

func (t *tracker) Free(ctx context.Context) error {
	err := t.Tracker.Free(ctx)
	t.once.Do(t.release)
	return err
}
