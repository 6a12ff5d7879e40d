package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
)

// connState is what CommitAsync needs of a connection to wait for it to be
// ready; *grpc.ClientConn has it.
type connState interface {
	GetState() connectivity.State
	WaitForStateChange(ctx context.Context, sourceState connectivity.State) bool
	Connect()
}

// CommitAsync commits request id on worker over a new Track stream and
// returns once the commit is sent, without waiting for the router's answer
// (the commit is pipelined: a caller that probed already has the worker's
// terms). committed (nil: nobody listens) is called once, from another
// goroutine, with the answer: the worker's selection, or why the commit
// failed (the router refused it, or the stream ended first; the request is
// then not on the router). committed must not block.
//
// ctx bounds sending the commit only, connecting included (a connection
// still connecting is waited for within ctx; one in transient failure fails
// at once, as a fail-fast call would): the stream lives until the
// AsyncTracker is freed, or the connection breaks, which frees the request
// on the router too. An error means nothing was committed and committed is
// not called. The AsyncTracker must be freed, a refused commit's too.
func (c *Client) CommitAsync(ctx context.Context, id string, worker routing.WorkerKey, p Prompt, committed func(routing.Selection, error)) (*AsyncTracker, error) {
	return c.CommitAsyncWith(ctx, id, worker, p, CommitOptions{}, committed)
}

// CommitAsyncWith is CommitAsync with options, which bound a commit
// without a worker (decide-and-commit).
func (c *Client) CommitAsyncWith(ctx context.Context, id string, worker routing.WorkerKey, p Prompt, o CommitOptions, committed func(routing.Selection, error)) (*AsyncTracker, error) {
	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	if committed == nil {
		committed = func(routing.Selection, error) {}
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.rpc.Track(sctx)
	if err != nil {
		cancel()
		return nil, fromStatus(err)
	}
	err = stream.Send(&localrouterv1.TrackRequest{Msg: &localrouterv1.TrackRequest_Commit{Commit: commitProto(id, worker, p, o)}})
	if err != nil {
		// Send reports io.EOF when the stream broke; the cause comes from
		// Recv. No receiver runs yet: ask here.
		if _, rerr := stream.Recv(); rerr != nil {
			err = rerr
		}
		cancel()
		return nil, fromStatus(err)
	}
	if ctx.Err() != nil {
		cancel()
		return nil, ctx.Err()
	}
	t := &AsyncTracker{
		stream: stream, cancel: cancel,
		committed:  committed,
		isl:        p.isl(),
		prefillAck: make(chan struct{}, 1),
		freeAck:    make(chan struct{}, 1),
		broken:     make(chan struct{}),
		done:       make(chan struct{}),
	}
	go t.receive()
	return t, nil
}

// waitReady waits, within ctx, for the connection to be ready: a stream
// opened while it is still connecting would wait for gRPC's connect
// timeout, past the request's deadline, since the stream's own context
// must outlive the request.
func (c *Client) waitReady(ctx context.Context) error {
	if c.state == nil {
		return nil
	}
	for {
		st := c.state.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			c.state.Connect()
		case connectivity.TransientFailure:
			return status.Errorf(codes.Unavailable, "local router %s: connection failed", c.target)
		case connectivity.Shutdown:
			return status.Errorf(codes.Canceled, "local router %s: connection closed", c.target)
		}
		if !c.state.WaitForStateChange(ctx, st) {
			return fmt.Errorf("local router %s: connecting: %w", c.target, ctx.Err())
		}
	}
}

// AsyncTracker is the lifecycle stream of a request committed with
// CommitAsync. Its methods are safe for concurrent use and idempotent, and
// may be called before the router answered the commit (events follow the
// commit on the stream, in order); PrefillComplete after Free does nothing;
// Free after any error, a refused commit included, still frees (the stream
// is closed). ctx bounds the wait for the router's acknowledgement.
//
// A receiver goroutine routes the router's answers; sends are serialised
// by sendMu (gRPC streams allow one sender at a time).
type AsyncTracker struct {
	stream localrouterv1.LocalRouter_TrackClient
	cancel context.CancelFunc

	// committed is told the router's answer to the commit, once.
	committed  func(routing.Selection, error)
	isl        int
	answered   bool // receiver's own
	prefillAck chan struct{}
	freeAck    chan struct{}
	broken     chan struct{} // closed when the stream ended; brokenErr says why
	brokenErr  error
	done       chan struct{} // closed when the receiver returned

	sendMu      sync.Mutex
	prefillSent bool
	freeSent    bool

	freeOnce sync.Once
	freeErr  error
}

var errStreamEnded = errors.New("track stream ended")

func (t *AsyncTracker) receive() {
	defer close(t.done)
	for {
		m, err := t.stream.Recv()
		if err != nil {
			t.brokenErr = err
			if err != io.EOF { // the router's clean end needs no status
				t.brokenErr = fromStatus(err)
			}
			// Told before broken closes: whoever sees the stream broken
			// already knows a refusal.
			if !t.answered {
				t.answered = true
				t.committed(routing.Selection{}, t.brokenErr)
			}
			close(t.broken)
			return
		}
		switch {
		case m.GetCommitted() != nil:
			if !t.answered {
				t.answered = true
				t.committed(selection(m.GetCommitted(), t.isl), nil)
			}
		case m.GetAcked() == localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE:
			select {
			case t.prefillAck <- struct{}{}:
			default:
			}
		case m.GetAcked() == localrouterv1.TrackEvent_TRACK_EVENT_FREE:
			select {
			case t.freeAck <- struct{}{}:
			default:
			}
		}
	}
}

// stop ends the stream and waits for the receiver.
func (t *AsyncTracker) stop() {
	t.cancel()
	<-t.done
}

func (t *AsyncTracker) send(ev localrouterv1.TrackEvent) error {
	return t.stream.Send(&localrouterv1.TrackRequest{Msg: &localrouterv1.TrackRequest_Event{Event: ev}})
}

// PrefillComplete marks the request's first token and waits, within ctx,
// for the router's acknowledgement.
func (t *AsyncTracker) PrefillComplete(ctx context.Context) error {
	t.sendMu.Lock()
	if t.prefillSent || t.freeSent {
		t.sendMu.Unlock()
		return nil
	}
	t.prefillSent = true
	err := t.send(localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE)
	t.sendMu.Unlock()
	if err != nil {
		<-t.broken
		return fmt.Errorf("prefill complete: %w: %w", errStreamEnded, t.brokenErr)
	}
	select {
	case <-t.prefillAck:
		return nil
	case <-t.broken:
		return fmt.Errorf("prefill complete: %w: %w", errStreamEnded, t.brokenErr)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Free frees the request, waits within ctx for the acknowledgement, and
// closes the stream (which frees the request on the router in any case).
func (t *AsyncTracker) Free(ctx context.Context) error {
	t.freeOnce.Do(func() {
		t.sendMu.Lock()
		t.freeSent = true
		err := t.send(localrouterv1.TrackEvent_TRACK_EVENT_FREE)
		t.sendMu.Unlock()
		if err == nil {
			select {
			case <-t.freeAck:
			case <-t.broken:
				// The router ends the stream after acknowledging; a
				// stream that ended before means the request was freed
				// by the stream's end.
			case <-ctx.Done():
				t.freeErr = ctx.Err()
			}
		}
		t.stop()
	})
	return t.freeErr
}
