package localrouterv1

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// ChannelErrorOf is a status as the Channel RPC answers a failed message:
// its code, message and, when it carries an ErrorInfo of ErrorDomain, its
// reason (the same a unary call's status would carry). Both servers of the
// API (localrouter/server, globalrouter/subtree) answer through it.
func ChannelErrorOf(st *status.Status) *ChannelError {
	ce := &ChannelError{Code: uint32(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			ce.Reason = info.GetReason()
		}
	}
	return ce
}
