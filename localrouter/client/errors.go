package client

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
)

// Error is a failed call to the service. It unwraps to the router's
// sentinel error when the server named one (errors.Is(err,
// routing.ErrUnknownRequest) works across the wire), and keeps the gRPC
// status (status.FromError works too).
type Error struct {
	Code    codes.Code
	Reason  string // localrouterv1.Reason…, "" if none
	Message string
	st      *status.Status
	err     error // the sentinel, if any
}

func (e *Error) Error() string              { return "local router: " + e.Code.String() + ": " + e.Message }
func (e *Error) Unwrap() error              { return e.err }
func (e *Error) GRPCStatus() *status.Status { return e.st }

var reasons = map[string]error{
	localrouterv1.ReasonEmptyRequest:      routing.ErrEmptyRequest,
	localrouterv1.ReasonBlockSizeMismatch: routing.ErrBlockSizeMismatch,
	localrouterv1.ReasonInvalidConfig:     routing.ErrInvalidConfig,
	localrouterv1.ReasonEmptyRequestID:    routing.ErrEmptyRequestID,
	localrouterv1.ReasonUnknownWorker:     routing.ErrUnknownWorker,
	localrouterv1.ReasonUnknownRequest:    routing.ErrUnknownRequest,
	localrouterv1.ReasonDuplicateRequest:  routing.ErrDuplicateRequest,
	localrouterv1.ReasonNotReady:          routing.ErrNotReady,
	localrouterv1.ReasonNoWorkers:         routing.ErrNoWorkers,
	localrouterv1.ReasonClosed:            routing.ErrClosed,
	localrouterv1.ReasonNoAllowedWorker:   routing.ErrNoAllowedWorker,
}

// fromStatus converts a gRPC error to *Error.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), st: st}
	switch st.Code() {
	case codes.Canceled:
		e.err = contextCanceled
	case codes.DeadlineExceeded:
		e.err = contextDeadline
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == localrouterv1.ErrorDomain {
			e.Reason = info.GetReason()
			if s := reasons[e.Reason]; s != nil {
				e.err = s
			}
		}
	}
	return e
}
