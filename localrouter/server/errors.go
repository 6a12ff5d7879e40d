package server

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
)

// errInvalidArgument marks request validation errors of this package.
var errInvalidArgument = errors.New("invalid argument")

// errorCodes maps the router's sentinel errors to gRPC codes and reasons:
// the one place where errors become statuses.
var errorCodes = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{localrouter.ErrEmptyRequest, codes.InvalidArgument, localrouterv1.ReasonEmptyRequest},
	{localrouter.ErrBlockSizeMismatch, codes.InvalidArgument, localrouterv1.ReasonBlockSizeMismatch},
	{kvevents.ErrBlockSize, codes.InvalidArgument, localrouterv1.ReasonBlockSizeMismatch},
	{localrouter.ErrInvalidConfig, codes.InvalidArgument, localrouterv1.ReasonInvalidConfig},
	{localrouter.ErrEmptyRequestID, codes.InvalidArgument, localrouterv1.ReasonEmptyRequestID},
	{localrouter.ErrReserveTTL, codes.InvalidArgument, localrouterv1.ReasonInvalidArgument},
	{errInvalidArgument, codes.InvalidArgument, localrouterv1.ReasonInvalidArgument},
	{localrouter.ErrUnknownWorker, codes.NotFound, localrouterv1.ReasonUnknownWorker},
	{localrouter.ErrUnknownRequest, codes.NotFound, localrouterv1.ReasonUnknownRequest},
	{localrouter.ErrDuplicateRequest, codes.AlreadyExists, localrouterv1.ReasonDuplicateRequest},
	{localrouter.ErrNotReady, codes.Unavailable, localrouterv1.ReasonNotReady},
	{localrouter.ErrNoWorkers, codes.Unavailable, localrouterv1.ReasonNoWorkers},
	{localrouter.ErrClosed, codes.Unavailable, localrouterv1.ReasonClosed},
	{localrouter.ErrNoAllowedWorker, codes.FailedPrecondition, localrouterv1.ReasonNoAllowedWorker},
}

// toStatus converts an error of the router to a gRPC status error carrying
// an ErrorInfo (domain localrouterv1.ErrorDomain) with the reason.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if st, ok := RouterStatus(err); ok {
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// RouterStatus is the status this service answers a router error with
// (one of errorCodes' sentinels: its code, and an ErrorInfo with its
// reason), and whether err is one. An in-process caller of the router
// (inproc.Client) gives its errors the codes the service would.
func RouterStatus(err error) (*status.Status, bool) {
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			st := status.New(e.code, err.Error())
			if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: localrouterv1.ErrorDomain, Reason: e.reason}); derr == nil {
				st = d
			}
			return st, true
		}
	}
	return nil, false
}
