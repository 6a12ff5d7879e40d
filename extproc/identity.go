package extproc

import (
	"context"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// peerVerified reports whether the stream's caller presented a client
// certificate this server verified (the ext_proc listener's mutual TLS,
// kvgate extproc -tls-client-ca-file): such a caller, the Envoy in
// front, may vouch for the identity it forwards
// (globalrouter.Request.PeerVerified: tenancy.identity xfcc and
// jwt-claim).
func peerVerified(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	return ok && len(ti.State.VerifiedChains) > 0
}
