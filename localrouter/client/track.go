package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
)

// Tracker holds a request's Track stream: the router frees the request when
// the stream ends, however it ends (Free, Close, the context passed to
// Track ending, or this process dying).
//
// Safe for concurrent use; calls are serialised.
type Tracker struct {
	id     string
	sel    routing.Selection
	cancel context.CancelFunc

	mu     sync.Mutex
	stream localrouterv1.LocalRouter_TrackClient
	done   bool
}

// Track commits request id on worker over a new Track stream. The stream
// lives as long as ctx: when ctx ends, the request is freed.
func (c *Client) Track(ctx context.Context, id string, worker routing.WorkerKey, p Prompt) (*Tracker, error) {
	return c.track(ctx, id, p.isl(), &localrouterv1.TrackRequest{Msg: &localrouterv1.TrackRequest_Commit{Commit: commitProto(id, worker, p, CommitOptions{})}})
}

// Attach takes over request id, already recorded by BestWorker with a
// request id or by Commit, so that it is freed when the stream ends.
func (c *Client) Attach(ctx context.Context, id string) (*Tracker, error) {
	return c.track(ctx, id, 0, &localrouterv1.TrackRequest{Msg: &localrouterv1.TrackRequest_Attach{Attach: &localrouterv1.AttachRequest{RequestId: id}}})
}

func (c *Client) track(ctx context.Context, id string, isl int, first *localrouterv1.TrackRequest) (*Tracker, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.rpc.Track(sctx)
	if err != nil {
		cancel()
		return nil, fromStatus(err)
	}
	if err := stream.Send(first); err != nil {
		_, rerr := stream.Recv() // the real error is on Recv
		cancel()
		return nil, fromStatus(errors.Join(rerr, err))
	}
	resp, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, fromStatus(err)
	}
	sel, ok := resp.GetMsg().(*localrouterv1.TrackResponse_Committed)
	if !ok {
		cancel()
		return nil, fmt.Errorf("local router track: unexpected first answer %T", resp.GetMsg())
	}
	return &Tracker{id: id, sel: selection(sel.Committed, isl), cancel: cancel, stream: stream}, nil
}

// RequestID is the tracked request's id.
func (t *Tracker) RequestID() string { return t.id }

// Selection is where the request was committed.
func (t *Tracker) Selection() routing.Selection { return t.sel }

func (t *Tracker) event(ev localrouterv1.TrackEvent) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return errTrackerDone
	}
	if ev == localrouterv1.TrackEvent_TRACK_EVENT_FREE {
		t.done = true
		defer t.cancel()
	}
	if err := t.stream.Send(&localrouterv1.TrackRequest{Msg: &localrouterv1.TrackRequest_Event{Event: ev}}); err != nil {
		_, rerr := t.stream.Recv()
		t.done = true
		t.cancel()
		if rerr == nil || errors.Is(rerr, io.EOF) {
			return fromStatus(err)
		}
		return fromStatus(rerr)
	}
	if _, err := t.stream.Recv(); err != nil {
		t.done = true
		t.cancel()
		return fromStatus(err)
	}
	return nil
}

// PrefillComplete marks the request's first token and waits for the
// router's acknowledgement.
func (t *Tracker) PrefillComplete() error {
	return t.event(localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE)
}

// Free frees the request and ends the stream. Calling it again returns nil.
func (t *Tracker) Free() error {
	err := t.event(localrouterv1.TrackEvent_TRACK_EVENT_FREE)
	if errors.Is(err, errTrackerDone) {
		return nil
	}
	return err
}

// Close ends the stream without waiting: the router frees the request.
func (t *Tracker) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	t.cancel()
}
