// Package track is the Track stream of the local-router API
// (api/localrouter/v1) as its servers serve it after the first message:
// the local router's own (localrouter/server) and a global router's
// subtree (globalrouter/subtree) share this one event loop, so neither
// links the other.
package track

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
)

// Events is what a Track stream's events act on: the one request the
// stream committed or attached. pool.Tracker is one.
type Events interface {
	PrefillComplete(ctx context.Context) error
	Free(ctx context.Context) error
}

// Serve is a Track stream after its first message: it answers committed,
// then applies each event to t and acknowledges it, until
// TRACK_EVENT_FREE (acknowledged, then nil), the client closing its side
// (nil) or an error. A message other than an event, or an unknown event,
// ends the stream with INVALID_ARGUMENT (reason INVALID_ARGUMENT); t's
// errors end it as toStatus makes them. Freeing the request when the
// stream ends otherwise is the caller's.
func Serve(ctx context.Context, stream localrouterv1.LocalRouter_TrackServer, committed *localrouterv1.Selection, t Events, toStatus func(error) error) error {
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

// invalidArgument is the INVALID_ARGUMENT status of msg, with the
// INVALID_ARGUMENT reason (as a local router's service answers one).
func invalidArgument(msg string) error {
	st := status.New(codes.InvalidArgument, "invalid argument: "+msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Domain: localrouterv1.ErrorDomain, Reason: localrouterv1.ReasonInvalidArgument}); err == nil {
		st = d
	}
	return st.Err()
}
