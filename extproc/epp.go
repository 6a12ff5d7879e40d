package extproc

import (
	"context"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/globalrouter"
)

// The Gateway API Inference Extension's endpoint-picker protocol v1.0.0
// (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol) on the ext_proc wire: the
// subset hint read from the request's metadata_context, the served endpoint
// read from the response's, and the health services. docs/envoy.md
// §"endpoint-picker protocol" maps each clause to its test.
const (
	// SubsetNamespace and SubsetKey name the endpoint subset a gateway may
	// send in metadata_context (filter metadata): a list of "ip:port"
	// strings the picker must choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// ServedKey is the envoy.lb (MetadataNamespace) metadata key with which
	// the data plane reports, on the response, the endpoint that served
	// the request.
	ServedKey = "x-gateway-destination-endpoint-served"

	// HealthLiveness and HealthReadiness are the protocol's health
	// services (besides the ExternalProcessor service name).
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
)

// maxSubsetEntries bounds how many subset entries are kept: far more
// endpoints than any pool has, and a bound on the work a hint can cause.
const maxSubsetEntries = 4096

// subsetOf reads the endpoint subset of a request's metadata_context: nil
// when the key is absent (no restriction), else the listed endpoints
// (possibly none, which allows none). The value is a list of strings, as
// the protocol says; a comma-separated string is read too. Entries that
// are not strings, or are empty, are skipped: they name no endpoint.
func subsetOf(md *corev3.Metadata) *globalrouter.Subset {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil
	}
	s := &globalrouter.Subset{}
	add := func(e string) {
		if e = strings.TrimSpace(e); e != "" && len(s.Addresses) < maxSubsetEntries {
			s.Addresses = append(s.Addresses, e)
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if sv, ok := e.GetKind().(*structpb.Value_StringValue); ok {
				for _, part := range strings.Split(sv.StringValue, ",") {
					add(part)
				}
			}
		}
	case *structpb.Value_StringValue:
		for _, part := range strings.Split(k.StringValue, ",") {
			add(part)
		}
	}
	return s
}

// servedOf reads the served endpoint of a response message's
// metadata_context ("" when absent).
func servedOf(md *corev3.Metadata) string {
	v := md.GetFilterMetadata()[MetadataNamespace].GetFields()[ServedKey]
	return strings.TrimSpace(v.GetStringValue())
}

// noteRequestMetadata keeps the subset hint of the request path's latest
// message until the decision.
func (x *exchange) noteRequestMetadata(req *extprocv3.ProcessingRequest) {
	if x.decided {
		return
	}
	if s := subsetOf(req.GetMetadataContext()); s != nil {
		x.subset = s
	}
	if j := req.GetMetadataContext().GetFilterMetadata()[globalrouter.JWTAuthnNamespace]; j != nil {
		x.jwtAuthn = j
	}
}

// noteServed moves the request's lifecycle to the endpoint the data plane
// says served it, when that is a fallback of the decision rather than the
// primary: committed on the fallback's local router, freed on the
// primary's (a best-effort decision's too: its late commit then names the
// fallback's worker). It runs once per exchange, on the first response
// message that carries the report.
func (x *exchange) noteServed(req *extprocv3.ProcessingRequest) {
	if x.decision == nil || x.servedSeen || x.freed {
		return
	}
	served := servedOf(req.GetMetadataContext())
	if served == "" {
		return
	}
	x.servedSeen = true
	if !x.decision.BestEffort {
		// A best-effort choice (the last known workers, no router
		// reached) says nothing of the workers' health; its lifecycle,
		// committed late, moves as any other.
		x.connectFailures(served)
	}
	if served == x.current.Address {
		return
	}
	var to *globalrouter.Endpoint
	for i := range x.decision.Fallbacks {
		if x.decision.Fallbacks[i].Address == served {
			to = &x.decision.Fallbacks[i]
			break
		}
	}
	if to == nil {
		x.log.Warn("the data plane reports a served endpoint the decision did not name; the lifecycle stays on the primary",
			"served", served, "primary", x.current.Address)
		return
	}
	m, ok := x.lease.(globalrouter.Mover)
	if !ok {
		x.log.Warn("the decision's lease cannot move to the served endpoint", "served", served)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.stream.Context()), x.s.cfg.LeaseTimeout)
	defer cancel()
	if err := m.Move(ctx, *to); err != nil {
		x.log.Warn("moving the request to the endpoint that served it failed", "served", served, "pool", to.Pool, "err", err)
		return
	}
	x.log.Debug("request moved to the endpoint that served it", "from", x.current.Address, "to", served, "pool", to.Pool)
	x.current = *to
}

// readier is what the Decider may also implement: whether it can route
// (globalrouter.Router: configuration loaded, a pool reachable).
type readier interface{ Ready() bool }

// ready reports the Decider's readiness (true when it does not say).
func (s *Server) ready() bool {
	if r, ok := s.decider.(readier); ok {
		return r.Ready()
	}
	return true
}

// setHealth sets the readiness-following services from ready; liveness
// and the server ("") are serving while the process serves.
func (s *Server) setHealth() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.ready() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(HealthReadiness, st)
	s.health.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, st)
}

// watchHealth refreshes readiness every ReadinessInterval until ctx ends.
func (s *Server) watchHealth(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReadinessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.setHealth()
		}
	}
}
