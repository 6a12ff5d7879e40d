package localrouterd

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/tlsconfig"
)

// lifecycleMethods change a router's state on a caller's word: under mutual
// TLS they are authorised by the caller's certificate, as is a BestWorker
// that records its request or the approximate index (changesState). Pure
// probes (BestWorker without either, PotentialLoads, Workers, Stats) and
// health stay open to any client the TLS layer let in.
var lifecycleMethods = map[string]bool{
	localrouterv1.LocalRouter_Commit_FullMethodName: true,
	localrouterv1.LocalRouter_Track_FullMethodName:  true,
	// The channel carries commits and frees as well as probes: a caller
	// not authorised for lifecycle calls probes with BestWorker.
	localrouterv1.LocalRouter_Channel_FullMethodName:             true,
	localrouterv1.LocalRouter_MarkPrefillComplete_FullMethodName: true,
	localrouterv1.LocalRouter_Free_FullMethodName:                true,
	localrouterv1.LocalRouter_DumpEvents_FullMethodName:          true,
}

// authorizer allows lifecycle calls from peers whose verified client
// certificate carries one of the allowed names (tlsconfig.PeerNames: a DNS
// or URI SAN, or the common name of a certificate without SANs).
type authorizer struct{ allowed []string }

// changesState reports whether a call changes the router's state: a
// lifecycle method, or a BestWorker that records its request (request_id)
// or writes the approximate index (update_indexer) — a probe in name only.
func changesState(method string, req any) bool {
	if lifecycleMethods[method] {
		return true
	}
	if bw, ok := req.(*localrouterv1.BestWorkerRequest); ok && method == localrouterv1.LocalRouter_BestWorker_FullMethodName {
		return bw.GetRequestId() != "" || bw.GetUpdateIndexer()
	}
	return false
}

func (a authorizer) check(ctx context.Context, method string, req any) error {
	if !changesState(method, req) {
		return nil
	}
	for _, n := range peerNames(ctx) {
		if slices.Contains(a.allowed, n) {
			return nil
		}
	}
	// The rule, never the router's state nor the peer's details.
	return status.Error(codes.PermissionDenied, fmt.Sprintf("%s: caller not authorised: lifecycle calls need a client certificate named in -authorized-clients", method))
}

// AuthorizationInterceptors return the interceptors that allow the
// local-router API's state-changing calls (lifecycle methods, a BestWorker
// with request_id or update_indexer) only from peers whose verified client
// certificate names one of allowed: what -authorized-clients installs on a
// local router, and on a global router serving the same API for its
// subtree (globalrouter/subtree).
func AuthorizationInterceptors(allowed []string) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	a := authorizer{allowed: allowed}
	return a.unary(), a.stream()
}

func (a authorizer) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := a.check(ctx, info.FullMethod, req); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

func (a authorizer) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := a.check(ss.Context(), info.FullMethod, nil); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

// peerNames are the names of the caller's verified certificate.
func peerNames(ctx context.Context) []string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return tlsconfig.PeerNames(ti.State.VerifiedChains[0][0])
}
