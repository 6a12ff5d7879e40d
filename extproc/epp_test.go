package extproc_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

// The endpoint-picker protocol on the ext_proc wire, one test per clause
// (the routing side is in globalrouter's epp_test.go, the whole path with
// real local routers in envoy's epp_test.go).

// eppClient is envoyClient for mode m that also forwards the given
// namespaces as metadata_context, as a gateway sending subset hints or
// served reports does.
func eppClient(t *testing.T, conn grpc.ClientConnInterface, m modes, forwarding ...string) *extprocclient.Client {
	t.Helper()
	cfg := envoyClient(t, conn, m).Config()
	cfg.ForwardingNamespaces = forwarding
	c, err := extprocclient.New(conn, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSubsetHintReachesDecider: a subset hint in metadata_context becomes
// Request.Subset; without one Subset is nil (no restriction); an empty
// list is an empty subset (allows nothing).
func TestSubsetHintReachesDecider(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{}, d)
	for _, m := range allModes {
		c := eppClient(t, conn, m, extprocclient.SubsetNamespace)
		for _, tc := range []struct {
			name string
			md   map[string]*structpb.Struct
			want *globalrouter.Subset
		}{
			{"none", nil, nil},
			{"list", extprocclient.SubsetHint("10.0.0.2:8000", "10.0.1.9:8000"), &globalrouter.Subset{Addresses: []string{"10.0.0.2:8000", "10.0.1.9:8000"}}},
			{"comma string", map[string]*structpb.Struct{extprocclient.SubsetNamespace: {Fields: map[string]*structpb.Value{
				extprocclient.SubsetKey: structpb.NewStringValue("10.0.0.2:8000, 10.0.1.9:8000")}}}, &globalrouter.Subset{Addresses: []string{"10.0.0.2:8000", "10.0.1.9:8000"}}},
			{"empty", extprocclient.SubsetHint(), &globalrouter.Subset{}},
		} {
			n := len(d.requests())
			_, err := c.Process(testenv.Context(t), extprocclient.Request{Metadata: tc.md, Message: extprocclient.Message{
				Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, d.requests()[n].Subset); diff != "" {
				t.Errorf("%s/%s: Request.Subset (-want +got):\n%s", m.name, tc.name, diff)
			}
		}
	}
}

// TestSubsetNoneEligible: the decider's ErrNoEndpointInSubset is a 503
// with reason no_endpoint_in_subset, OpenAI-shaped, with retry-after.
func TestSubsetNoneEligible(t *testing.T) {
	d := &deciderDouble{decide: func(*globalrouter.Request) (*globalrouter.Decision, error) {
		return nil, fmt.Errorf("x: %w", globalrouter.ErrNoEndpointInSubset)
	}}
	conn, _ := startServer(t, extproc.Config{}, d)
	res, err := eppClient(t, conn, allModes[0], extprocclient.SubsetNamespace).Process(testenv.Context(t), extprocclient.Request{
		Metadata: extprocclient.SubsetHint(), Message: extprocclient.Message{Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	lr := res.Info.LocalReply
	if lr == nil || lr.Status != 503 || get(lr.Headers, "x-kvgate-dropped-reason") != "no_endpoint_in_subset" || get(lr.Headers, "retry-after") == "" {
		t.Fatalf("local reply %+v, want 503 no_endpoint_in_subset with retry-after", lr)
	}
}

// moverLease is leaseDouble that can also move (globalrouter.Mover).
type moverLease struct{ *leaseDouble }

func (l moverLease) Move(ctx context.Context, to globalrouter.Endpoint) error {
	l.add("move " + to.Address)
	return nil
}

// TestServedMovesLifecycle: the data plane serves the request from the
// first fallback (the primary refused the connection) and reports it in
// the response's metadata_context; the lease moves there before prefill
// complete and free, and the response names the endpoint that served it.
// A report of the primary moves nothing. A best-effort decision moves as
// any other (its late commit must name the worker that served it).
func TestServedMovesLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		refuse   map[string]bool // endpoints that refuse the connection
		want     []string
		endpoint string
	}{
		{"fallback served", map[string]bool{wantPrimary: true}, []string{"move 10.0.0.2:8000", "prefill", "free"}, "10.0.0.2:8000"},
		{"second fallback served", map[string]bool{wantPrimary: true, "10.0.0.2:8000": true}, []string{"move 10.0.1.9:8000", "prefill", "free"}, "10.0.1.9:8000"},
		{"primary served", nil, []string{"prefill", "free"}, wantPrimary},
	} {
		for _, m := range allModes {
			for _, bestEffort := range []bool{false, true} {
				name := tc.name + "/" + m.name
				if bestEffort {
					name += "/best effort"
				}
				t.Run(name, func(t *testing.T) {
					var lease *leaseDouble
					d := &deciderDouble{}
					conn, _ := startServer(t, extproc.Config{}, deciderFunc(func(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
						dec, err := d.Decide(ctx, req)
						if err == nil {
							lease = dec.Lease.(*leaseDouble)
							dec.Lease = moverLease{lease}
							dec.BestEffort = bestEffort
						}
						return dec, err
					}))
					c := eppClient(t, conn, m, "envoy.lb")
					ctx := testenv.Context(t)
					res, err := c.Process(ctx, extprocclient.Request{
						Message: extprocclient.Message{Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)}},
						Endpoint: func(ctx context.Context, ep string, req *extprocclient.Message) (*extprocclient.Message, error) {
							if tc.refuse[ep] {
								return nil, extprocclient.ErrConnectFailure
							}
							return sseResponse("data: {}\n\n")(ctx, req)
						},
					})
					if err != nil {
						t.Fatal(err)
					}
					if lease == nil {
						t.Fatal("no decision")
					}
					if diff := cmp.Diff(tc.want, lease.calls()); diff != "" {
						t.Errorf("lease calls (-want +got):\n%s", diff)
					}
					if got := get(res.Downstream.Headers, "x-kvgate-endpoint"); got != tc.endpoint {
						t.Errorf("x-kvgate-endpoint %q, want %q", got, tc.endpoint)
					}
				})
			}
		}
	}
}

// deciderFunc is a globalrouter.Decider from a function (test seam).
type deciderFunc func(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error)

func (f deciderFunc) Decide(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
	return f(ctx, req)
}

// readyDecider is deciderDouble with a readiness switch.
type readyDecider struct {
	deciderDouble
	ok atomic.Bool
}

func (d *readyDecider) Ready() bool { return d.ok.Load() }

// TestHealthServices: liveness serves while the process serves; readiness
// and envoy.service.ext_proc.v3.ExternalProcessor follow the decider's
// readiness (globalrouter.Router: configuration loaded, a pool reachable).
func TestHealthServices(t *testing.T) {
	d := &readyDecider{}
	conn, _ := startServer(t, extproc.Config{ReadinessInterval: 5 * time.Millisecond}, d)
	hc := healthpb.NewHealthClient(conn)
	ctx := testenv.Context(t)
	wait := func(svc string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err == nil && r.GetStatus() == want {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("health %q: got %v (%v), want %v", svc, r.GetStatus(), err, want)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	const extprocSvc = "envoy.service.ext_proc.v3.ExternalProcessor"
	wait(extproc.HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	wait(extproc.HealthReadiness, healthpb.HealthCheckResponse_NOT_SERVING)
	wait(extprocSvc, healthpb.HealthCheckResponse_NOT_SERVING)
	d.ok.Store(true)
	wait(extproc.HealthReadiness, healthpb.HealthCheckResponse_SERVING)
	wait(extprocSvc, healthpb.HealthCheckResponse_SERVING)
	wait(extproc.HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	d.ok.Store(false)
	wait(extproc.HealthReadiness, healthpb.HealthCheckResponse_NOT_SERVING)
	wait(extproc.HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); err == nil {
		t.Error("unknown service: no error")
	}
}

// TestServedOnLaterMessage: the served report may first appear on a later
// response message than the headers (read on every one); a report naming
// an endpoint the decision did not list moves nothing.
func TestServedOnLaterMessage(t *testing.T) {
	for _, tc := range []struct {
		name, served string
		want         []string
		endpoint     string // x-kvgate-endpoint on the response
	}{
		{"fallback reported on the body", "10.0.0.2:8000", []string{"move 10.0.0.2:8000", "prefill", "free"}, wantPrimary},
		{"unknown endpoint reported", "192.0.2.7:1", []string{"prefill", "free"}, wantPrimary},
	} {
		for _, m := range allModes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				var lease *leaseDouble
				d := &deciderDouble{}
				conn, _ := startServer(t, extproc.Config{}, deciderFunc(func(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
					dec, err := d.Decide(ctx, req)
					if err == nil {
						lease = dec.Lease.(*leaseDouble)
						dec.Lease = moverLease{lease}
					}
					return dec, err
				}))
				ctx := testenv.Context(t)
				s := eppClient(t, conn, m, "envoy.lb").Open(ctx, nil)
				defer s.Close()
				if err := s.SendRequestHeaders(ctx, post("/v1/completions"), false); err != nil {
					t.Fatal(err)
				}
				if err := s.SendRequestData(ctx, []byte(`{"model":"m1","prompt":"hi"}`), true); err != nil {
					t.Fatal(err)
				}
				drain(t, ctx, s.ReadUpstream)
				if err := s.SendResponseHeaders(ctx, extprocclient.Headers{{Key: ":status", Value: "200"}}, false); err != nil {
					t.Fatal(err)
				}
				var hdrs extprocclient.Headers
				for hdrs == nil { // the response headers have gone downstream
					f, err := s.ReadDownstream(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if f.Kind == extprocclient.FrameHeaders {
						hdrs = f.Headers
					}
				}
				s.ReportServed(tc.served)
				if err := s.SendResponseData(ctx, []byte("ok"), true); err != nil {
					t.Fatal(err)
				}
				drain(t, ctx, s.ReadDownstream)
				s.Close()
				if diff := cmp.Diff(tc.want, lease.calls()); diff != "" {
					t.Errorf("lease calls (-want +got):\n%s", diff)
				}
				if got := get(hdrs, "x-kvgate-endpoint"); got != tc.endpoint {
					t.Errorf("x-kvgate-endpoint %q, want %q (set before the report)", got, tc.endpoint)
				}
			})
		}
	}
}

// TestRegisterHealthOnItsOwnServer: a health-only gRPC server (a plaintext
// probe port) answers the same statuses.
func TestRegisterHealthOnItsOwnServer(t *testing.T) {
	d := &readyDecider{}
	d.ok.Store(true)
	srv, err := extproc.New(extproc.Config{}, d, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.RegisterHealth(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, svc := range []string{extproc.HealthLiveness, extproc.HealthReadiness, "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := healthpb.NewHealthClient(conn).Check(testenv.Context(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: %v %v, want SERVING", svc, r.GetStatus(), err)
		}
	}
}
