package envoy_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/envoy"
	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// The endpoint-picker protocol end to end: the Envoy-faithful client with
// the shipped bootstrap's filter settings, kvgate's ext_proc server, the
// global router and two pools of real local routers. docs/envoy.md
// §"endpoint-picker protocol" maps each clause to these tests.

type eppStack struct {
	a, b *pooltest.Server
	conn *grpc.ClientConn
	wa   []pooltest.Worker
	wb   []pooltest.Worker
}

func startEPPStack(t *testing.T) *eppStack {
	t.Helper()
	s := &eppStack{wa: pooltest.Workers("a", 2), wb: pooltest.Workers("b", 2)}
	s.a = pooltest.Start(t, "pool-a", 16, s.wa...)
	s.b = pooltest.Start(t, "pool-b", 16, s.wb...)
	cfg := globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{"m"}, s.a.Addr),
		pool.NewConfig("pool-b", 16, []string{"m"}, s.b.Addr),
	)
	cfg.Probe.Timeout = 10 * time.Second
	// The tests read the routing headers on the response: an operator's
	// caller (globalrouter trust.routing_headers, off by default).
	cfg.Trust.RoutingHeaders = globalrouter.AccessOn
	// One fallback per other pool, none of the same pool's: the lists the
	// tests compare stay what the two pools' probes name.
	cfg.Probe.SamePoolFallbacks = -1
	tok, err := tokenizer.Load(tokenizer.Config{Backend: tokenizer.BackendEstimate})
	if err != nil {
		t.Fatal(err)
	}
	r, err := globalrouter.New(cfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)), globalrouter.WithTokenizer("m", tok))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := extproc.New(extproc.Config{}, r, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	s.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		_ = r.Close()
	})
	return s
}

// client is the bootstrap's filter, plus the forwarding namespaces given
// (a gateway that sends subset hints forwards envoy.lb.subset_hint).
func (s *eppStack) client(t *testing.T, forwarding ...string) *extprocclient.Client {
	t.Helper()
	cfg, err := envoy.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.MessageTimeout = 10 * time.Second // a shared machine
	cfg.ForwardingNamespaces = append(cfg.ForwardingNamespaces, forwarding...)
	c, err := extprocclient.New(s.conn, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func completion() extprocclient.Message {
	return extprocclient.Message{
		Headers: extprocclient.Headers{
			{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"},
			{Key: ":authority", Value: "kvgate"}, {Key: ":scheme", Value: "http"},
			{Key: "content-type", Value: "application/json"},
		},
		Body: [][]byte{[]byte(`{"model":"m","prompt":"` + longPrompt + `"}`)},
	}
}

const longPrompt = "the quick brown fox jumps over the lazy dog again and again, many times over, until the blocks fill up completely"

func ok200(ctx context.Context, ep string, req *extprocclient.Message) (*extprocclient.Message, error) {
	return &extprocclient.Message{Headers: extprocclient.Headers{{Key: ":status", Value: "200"}}, Body: [][]byte{[]byte("ok")}}, nil
}

// Destination clause: header and envoy.lb metadata carry the same ordered
// list, primary first, then a fallback in the other pool.
func TestEPPDestinationIdentical(t *testing.T) {
	s := startEPPStack(t)
	res, err := s.client(t).Process(testenv.Context(t), extprocclient.Request{Message: completion(), Endpoint: ok200})
	if err != nil {
		t.Fatal(err)
	}
	if lr := res.Info.LocalReply; lr != nil {
		t.Fatalf("local reply %d %s", lr.Status, lr.Body)
	}
	eps, err := extprocclient.Destinations(res.Upstream.Headers, res.Info)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 {
		t.Fatalf("destinations %v, want a primary and one fallback", eps)
	}
	h, _ := res.Upstream.Headers.Get(extprocclient.DestinationKey)
	if md := res.Info.DynamicMetadata[extprocclient.LBNamespace].GetFields()[extprocclient.DestinationKey].GetStringValue(); h != md {
		t.Errorf("header %q, metadata %q: must be the same", h, md)
	}
}

// Subset clause: the picker chooses only from the hint, for the primary
// and every fallback; none eligible or an empty list is a 503.
func TestEPPSubset(t *testing.T) {
	s := startEPPStack(t)
	c := s.client(t, extprocclient.SubsetNamespace)
	ctx := testenv.Context(t)
	for _, subset := range [][]string{{s.wa[1].Address}, {s.wb[0].Address, s.wa[0].Address}, {s.wb[1].Address}} {
		res, err := c.Process(ctx, extprocclient.Request{Message: completion(), Metadata: extprocclient.SubsetHint(subset...), Endpoint: ok200})
		if err != nil {
			t.Fatal(err)
		}
		if lr := res.Info.LocalReply; lr != nil {
			t.Fatalf("subset %v: local reply %d %s", subset, lr.Status, lr.Body)
		}
		eps, err := extprocclient.Destinations(res.Upstream.Headers, res.Info)
		if err != nil {
			t.Fatal(err)
		}
		for _, ep := range eps {
			if !slices.Contains(subset, ep) {
				t.Errorf("subset %v: endpoint %s outside it (list %v)", subset, ep, eps)
			}
		}
	}
	for _, subset := range [][]string{{}, {"192.0.2.1:8000"}} {
		res, err := c.Process(ctx, extprocclient.Request{Message: completion(), Metadata: extprocclient.SubsetHint(subset...), Endpoint: ok200})
		if err != nil {
			t.Fatal(err)
		}
		lr := res.Info.LocalReply
		if lr == nil || lr.Status != 503 {
			t.Fatalf("subset %v: got %+v, want a 503 local reply", subset, lr)
		}
		if r, _ := lr.Headers.Get("x-kvgate-dropped-reason"); r != "no_endpoint_in_subset" {
			t.Errorf("subset %v: reason %q, want no_endpoint_in_subset", subset, r)
		}
	}
	if err := s.a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
	if err := s.b.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}

// The shipped bootstrap does not forward envoy.lb.subset_hint: a hint set
// by anything before the filter never reaches kvgate, so no client can
// narrow (or empty) the picker's choice through it.
func TestEPPBootstrapForwardsNoSubset(t *testing.T) {
	cfg, err := envoy.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(cfg.ForwardingNamespaces, extprocclient.SubsetNamespace) {
		t.Fatalf("the bootstrap forwards %s", extprocclient.SubsetNamespace)
	}
	s := startEPPStack(t)
	res, err := s.client(t).Process(testenv.Context(t), extprocclient.Request{Message: completion(), Metadata: extprocclient.SubsetHint(), Endpoint: ok200})
	if err != nil {
		t.Fatal(err)
	}
	if lr := res.Info.LocalReply; lr != nil {
		t.Fatalf("local reply %d %s: the hint reached kvgate", lr.Status, lr.Body)
	}
}

// Served clause: the primary refuses the connection, the data plane serves
// from the fallback and reports it; the request's lifecycle moves there
// (the response names the fallback's pool), and both routers end idle.
func TestEPPServedFallback(t *testing.T) {
	s := startEPPStack(t)
	ctx := testenv.Context(t)
	var primary string
	res, err := s.client(t).Process(ctx, extprocclient.Request{Message: completion(),
		Endpoint: func(ctx context.Context, ep string, req *extprocclient.Message) (*extprocclient.Message, error) {
			if primary == "" {
				primary = ep
				return nil, extprocclient.ErrConnectFailure
			}
			return ok200(ctx, ep, req)
		}})
	if err != nil {
		t.Fatal(err)
	}
	eps, _ := extprocclient.Destinations(res.Upstream.Headers, res.Info)
	served := res.Info.DynamicMetadata[extprocclient.LBNamespace].GetFields()[extprocclient.ServedKey].GetStringValue()
	if len(eps) < 2 || served != eps[1] {
		t.Fatalf("served %q, list %v: want the first fallback", served, eps)
	}
	if got, _ := res.Downstream.Headers.Get("x-kvgate-endpoint"); got != served {
		t.Errorf("x-kvgate-endpoint %q, want the served %q", got, served)
	}
	if err := s.a.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
	if err := s.b.WaitIdle(ctx); err != nil {
		t.Error(err)
	}
}

// Served clause, the data plane's half: the shipped bootstrap's
// override_host policy records the host it picked under envoy.lb
// x-gateway-destination-endpoint-served, a namespace the ext_proc filter
// forwards, so the response's messages carry the report.
func TestEPPBootstrapReportsServed(t *testing.T) {
	b, err := envoy.DecodeBootstrap(envoy.BootstrapYAML())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoy.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != "kvgate_workers" {
			continue
		}
		oh, err := envoy.OverrideHostPolicy(c)
		if err != nil {
			t.Fatal(err)
		}
		k := oh.GetSelectedHostKey()
		if k.GetKey() != extprocclient.LBNamespace || len(k.GetPath()) != 1 || k.GetPath()[0].GetKey() != extprocclient.ServedKey {
			t.Errorf("selected_host_key %v, want %s / %s", k, extprocclient.LBNamespace, extprocclient.ServedKey)
		}
		if !slices.Contains(cfg.ForwardingNamespaces, k.GetKey()) {
			t.Errorf("the served report's namespace %q is not forwarded (%v)", k.GetKey(), cfg.ForwardingNamespaces)
		}
		return
	}
	t.Fatal("no kvgate_workers cluster")
}
