package envoy_test

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/envoy"
	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
)

// TestDefaultDestinationFitsBootstrap: the shipped bootstrap's override_host
// policy reads the destination header and the envoy.lb list. kvgate's
// ext_proc server, in its default configuration and with the bootstrap's
// filter settings, puts the ordered list (primary, then fallbacks) in the
// header and exactly the same value in envoy.lb metadata (the
// endpoint-picker protocol forbids different values).
func TestDefaultDestinationFitsBootstrap(t *testing.T) {
	header := destinationHeader(t)

	srv, err := extproc.New(extproc.Config{}, fixedDecider{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srvCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(srvCtx, lis) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	cfg, err := envoy.ClientConfig() // the bootstrap's ext_proc filter
	if err != nil {
		t.Fatal(err)
	}
	c, err := extprocclient.New(conn, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Process(ctx, extprocclient.Request{
		Message: extprocclient.Message{
			Headers: extprocclient.Headers{
				{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"},
				{Key: ":authority", Value: "kvgate"}, {Key: ":scheme", Value: "http"},
				{Key: "content-type", Value: "application/json"},
			},
			Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
		},
		Upstream: func(ctx context.Context, req *extprocclient.Message) (*extprocclient.Message, error) {
			return &extprocclient.Message{Headers: extprocclient.Headers{{Key: ":status", Value: "200"}}, Body: [][]byte{[]byte("ok")}}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if lr := res.Info.LocalReply; lr != nil {
		t.Fatalf("local reply %d %s", lr.Status, lr.Body)
	}
	got, ok := res.Upstream.Headers.Get(header)
	if !ok {
		t.Fatalf("no %s header on the upstream request", header)
	}
	// The endpoint-picker protocol: the header and the envoy.lb metadata
	// carry the same value, the ordered list (primary, then fallbacks),
	// which Envoy's override_host policy reads.
	want := "10.0.0.1:8000,10.0.0.2:8000"
	for _, ep := range strings.Split(got, ",") {
		if _, err := netip.ParseAddrPort(ep); err != nil {
			t.Errorf("%s = %q: %q is not an ip:port (%v)", header, got, ep, err)
		}
	}
	if got != want {
		t.Errorf("%s = %q, want %q (primary, then fallbacks)", header, got, want)
	}
	lb := res.Info.DynamicMetadata["envoy.lb"].GetFields()[header].GetStringValue()
	if lb != got {
		t.Errorf("envoy.lb %s = %q, header %q: must be the same", header, lb, got)
	}
}

// destinationHeader returns the header the bootstrap's route cluster takes
// its destination from, failing unless that cluster's override_host policy
// reads one.
func destinationHeader(t *testing.T) string {
	t.Helper()
	b, err := envoy.DecodeBootstrap(envoy.BootstrapYAML())
	if err != nil {
		t.Fatal(err)
	}
	hcms, err := envoy.HTTPConnectionManagers(b)
	if err != nil || len(hcms) != 1 {
		t.Fatalf("got %d connection managers (%v), want 1", len(hcms), err)
	}
	route := hcms[0].GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetCluster()
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != route {
			continue
		}
		oh, err := envoy.OverrideHostPolicy(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, src := range oh.GetOverrideHostSources() {
			if h := src.GetHeader(); h != "" {
				return strings.ToLower(h)
			}
		}
		t.Fatalf("route cluster %q: override_host reads no header", route)
	}
	t.Fatalf("route cluster %q not found", route)
	return ""
}

// fixedDecider stands in for the global router, the one seam this test
// replaces: every request goes to 10.0.0.1:8000 with one fallback.
type fixedDecider struct{}

func (fixedDecider) Decide(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
	return &globalrouter.Decision{
		Primary:   globalrouter.Endpoint{Pool: "pool-a", Selection: routing.Selection{WorkerID: "w1", Address: "10.0.0.1:8000"}},
		Fallbacks: []globalrouter.Endpoint{{Pool: "pool-b", Selection: routing.Selection{WorkerID: "w2", Address: "10.0.0.2:8000"}}},
		Lease:     noLease{},
	}, nil
}

type noLease struct{}

func (noLease) PrefillComplete(ctx context.Context) error { return nil }
func (noLease) Free(ctx context.Context) error            { return nil }
