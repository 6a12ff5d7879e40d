package server

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/kvgate/kvgate/api/localrouter/track"
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

// TrackEvents is what a Track stream's events act on (api/localrouter/track).
type TrackEvents = track.Events

// ServeTrackEvents is a Track stream after its first message
// (api/localrouter/track.Serve, shared with a global router's subtree).
func ServeTrackEvents(ctx context.Context, stream localrouterv1.LocalRouter_TrackServer, committed *localrouterv1.Selection, t TrackEvents, toStatus func(error) error) error {
	return track.Serve(ctx, stream, committed, t, toStatus)
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
