package server

import (
	"context"
	"errors"
	"fmt"
	"io"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter"
)

// Track implements localrouterv1.LocalRouterServer: one request's lifecycle
// as a stream. Whatever ends the stream after the request was committed or
// attached (the client closing its side, TRACK_EVENT_FREE, an error, the
// client vanishing) frees the request.
func (s *Server) Track(stream localrouterv1.LocalRouter_TrackServer) error {
	s.trackStreams.Add(1)
	defer s.trackStreams.Add(-1)
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	var (
		id  string
		sel routing.Selection
	)
	switch m := first.GetMsg().(type) {
	case *localrouterv1.TrackRequest_Commit:
		if sel, err = s.commit(ctx, m.Commit); err != nil {
			return toStatus(err)
		}
		id = m.Commit.GetRequestId()
	case *localrouterv1.TrackRequest_Attach:
		id = m.Attach.GetRequestId()
		if id == "" {
			return toStatus(localrouter.ErrEmptyRequestID)
		}
		key, ok := s.r.Active().Has(id)
		if !ok {
			return toStatus(fmt.Errorf("%w: %q", localrouter.ErrUnknownRequest, id))
		}
		sel = routing.Selection{WorkerID: key.ID, DPRank: key.DPRank}
	default:
		return toStatus(fmt.Errorf("%w: the first Track message must be commit or attach", errInvalidArgument))
	}
	// The request is ours from here on: free it however the stream ends.
	// The stream's context may be gone already, so free without it.
	req := &trackedRequest{s: s, id: id}
	defer func() {
		if !req.freed {
			if err := s.free(context.WithoutCancel(ctx), id); err == nil {
				s.log.Debug("request freed at the end of its track stream", "request_id", id)
			}
		}
	}()
	return ServeTrackEvents(ctx, stream, s.selection(sel), req, toStatus)
}

// TrackEvents is what a Track stream's events act on: the one request the
// stream committed or attached. pool.Tracker is one.
type TrackEvents interface {
	PrefillComplete(ctx context.Context) error
	Free(ctx context.Context) error
}

// ServeTrackEvents is a Track stream after its first message, for every
// server of the local-router API (this one, a subtree's): it answers
// committed, then applies each event to t and acknowledges it, until
// TRACK_EVENT_FREE (acknowledged, then nil), the client closing its side
// (nil) or an error. A message other than an event, or an unknown event,
// ends the stream with INVALID_ARGUMENT (reason INVALID_ARGUMENT); t's
// errors end it as toStatus makes them. Freeing the request when the stream
// ends otherwise is the caller's.
func ServeTrackEvents(ctx context.Context, stream localrouterv1.LocalRouter_TrackServer, committed *localrouterv1.Selection, t TrackEvents, toStatus func(error) error) error {
	if err := stream.Send(&localrouterv1.TrackResponse{Msg: &localrouterv1.TrackResponse_Committed{Committed: committed}}); err != nil {
		return err
	}
	for {
		in, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		ev, ok := in.GetMsg().(*localrouterv1.TrackRequest_Event)
		if !ok {
			return invalidArgument("only events may follow the first Track message")
		}
		switch ev.Event {
		case localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE:
			if err := t.PrefillComplete(ctx); err != nil {
				return toStatus(err)
			}
		case localrouterv1.TrackEvent_TRACK_EVENT_FREE:
			if err := t.Free(ctx); err != nil {
				return toStatus(err)
			}
		default:
			return invalidArgument(fmt.Sprintf("unknown track event %v", ev.Event))
		}
		if err := stream.Send(&localrouterv1.TrackResponse{Msg: &localrouterv1.TrackResponse_Acked{Acked: ev.Event}}); err != nil {
			return err
		}
		if ev.Event == localrouterv1.TrackEvent_TRACK_EVENT_FREE {
			return nil
		}
	}
}

// invalidArgument is this package's INVALID_ARGUMENT status of msg.
func invalidArgument(msg string) error {
	return toStatus(fmt.Errorf("%w: %s", errInvalidArgument, msg))
}

// trackedRequest is a request of this router's as a Track stream's events
// see it; freed records that the stream's FREE event reached the router
// (then the stream's end has nothing left to free).
type trackedRequest struct {
	s     *Server
	id    string
	freed bool
}

func (r *trackedRequest) PrefillComplete(ctx context.Context) error {
	return r.s.markPrefillComplete(ctx, r.id)
}

func (r *trackedRequest) Free(ctx context.Context) error {
	r.freed = true
	return r.s.free(ctx, r.id)
}
