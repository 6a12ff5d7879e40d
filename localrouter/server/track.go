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
	freed := false
	defer func() {
		if !freed {
			if err := s.free(context.WithoutCancel(ctx), id); err == nil {
				s.log.Debug("request freed at the end of its track stream", "request_id", id)
			}
		}
	}()
	if err := stream.Send(&localrouterv1.TrackResponse{Msg: &localrouterv1.TrackResponse_Committed{Committed: s.selection(sel)}}); err != nil {
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
			return toStatus(fmt.Errorf("%w: only events may follow the first Track message", errInvalidArgument))
		}
		switch ev.Event {
		case localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE:
			if err := s.markPrefillComplete(ctx, id); err != nil {
				return toStatus(err)
			}
		case localrouterv1.TrackEvent_TRACK_EVENT_FREE:
			freed = true
			if err := s.free(ctx, id); err != nil {
				return toStatus(err)
			}
		default:
			return toStatus(fmt.Errorf("%w: unknown track event %v", errInvalidArgument, ev.Event))
		}
		if err := stream.Send(&localrouterv1.TrackResponse{Msg: &localrouterv1.TrackResponse_Acked{Acked: ev.Event}}); err != nil {
			return err
		}
		if freed {
			return nil
		}
	}
}
