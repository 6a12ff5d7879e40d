package extproc_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
)

// deciderDouble is a test double at the one seam it replaces,
// globalrouter.Decider: it records requests and answers with decide (or a
// fixed decision), handing out a leaseDouble per decision.
type deciderDouble struct {
	decide func(req *globalrouter.Request) (*globalrouter.Decision, error)

	mu     sync.Mutex
	reqs   []*globalrouter.Request
	leases []*leaseDouble
}

func (d *deciderDouble) Decide(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
	d.mu.Lock()
	d.reqs = append(d.reqs, req)
	d.mu.Unlock()
	var dec *globalrouter.Decision
	if d.decide != nil {
		var err error
		if dec, err = d.decide(req); err != nil {
			return nil, err
		}
	} else {
		dec = fixedDecision()
	}
	l := &leaseDouble{}
	dec.Lease = l
	d.mu.Lock()
	d.leases = append(d.leases, l)
	d.mu.Unlock()
	return dec, nil
}

func (d *deciderDouble) requests() []*globalrouter.Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.reqs)
}

func (d *deciderDouble) lease(t *testing.T, i int) *leaseDouble {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if i >= len(d.leases) {
		t.Fatalf("lease %d: only %d decisions made", i, len(d.leases))
	}
	return d.leases[i]
}

// leaseDouble records the lifecycle calls the server makes, in order.
type leaseDouble struct {
	mu     sync.Mutex
	events []string
}

func (l *leaseDouble) PrefillComplete(ctx context.Context) error { l.add("prefill"); return nil }
func (l *leaseDouble) Free(ctx context.Context) error            { l.add("free"); return nil }

func (l *leaseDouble) add(e string) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *leaseDouble) calls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func fixedDecision() *globalrouter.Decision {
	return &globalrouter.Decision{
		Primary: globalrouter.Endpoint{Pool: "pool-a", Selection: routing.Selection{WorkerID: "w1", DPRank: 2, Address: "10.0.0.1:8000", OverlapBlocks: 7}},
		Fallbacks: []globalrouter.Endpoint{
			{Pool: "pool-a", Selection: routing.Selection{WorkerID: "w2", Address: "10.0.0.2:8000"}},
			{Pool: "pool-a", Selection: routing.Selection{WorkerID: "w1", DPRank: 1, Address: "10.0.0.1:8000"}}, // same address: listed once
			{Pool: "pool-b", Selection: routing.Selection{WorkerID: "w9", Address: "10.0.1.9:8000"}},
		},
		ISL:         42,
		Explanation: "pool-a: overlap 7 blocks\npool-b: overlap 0 blocks",
		Expose:      true, // an operator's own caller: routing headers on the response
	}
}

// wantPrimary is fixedDecision's primary address; wantDestination is its
// whole list, the value of both the header and the envoy.lb metadata.
const (
	wantPrimary     = "10.0.0.1:8000"
	wantDestination = "10.0.0.1:8000,10.0.0.2:8000,10.0.1.9:8000"
)

// startServer runs an extproc.Server on a loopback listener and returns a
// connection to it; both stop at cleanup.
func startServer(t testing.TB, cfg extproc.Config, d globalrouter.Decider) (*grpc.ClientConn, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	srv, err := extproc.New(cfg, d, slog.New(slog.DiscardHandler), reg)
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
	conn, err := grpc.NewClient(lis.Addr().String(), append(extprocclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return conn, reg
}

type modes struct {
	name      string
	req, resp extprocfilterv3.ProcessingMode_BodySendMode
}

var allModes = []modes{
	{"req=FDS/resp=STREAMED", extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_STREAMED},
	{"req=FDS/resp=FDS", extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
	{"req=BUFFERED/resp=STREAMED", extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED},
	{"req=BUFFERED/resp=FDS", extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
}

// envoyClient is the Envoy-faithful client configured as kvgate's shipped
// bootstrap does: trailers SEND where FDS needs them, envoy.lb writable.
func envoyClient(t testing.TB, conn grpc.ClientConnInterface, m modes) *extprocclient.Client {
	t.Helper()
	pm := &extprocfilterv3.ProcessingMode{RequestBodyMode: m.req, ResponseBodyMode: m.resp}
	if m.req == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		pm.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
	}
	if m.resp == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		pm.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
	}
	c, err := extprocclient.New(conn, extprocclient.Config{
		ProcessingMode:      pm,
		ReceivingNamespaces: []string{"envoy.lb"},
		MessageTimeout:      5 * time.Second, // generous under -race on a shared machine
		BufferLimit:         32 << 20,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func post(path string, extra ...extprocclient.HeaderField) extprocclient.Headers {
	h := extprocclient.Headers{
		{Key: ":method", Value: "POST"},
		{Key: ":path", Value: path},
		{Key: ":authority", Value: "gateway.local"},
		{Key: ":scheme", Value: "http"},
		{Key: "content-type", Value: "application/json"},
	}
	return append(h, extra...)
}

const chatBody = `{"model":"m1","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"héllo 世界, \"quoted\""}],"stream":true}`

// sseResponse is an upstream answering with an SSE stream in the given
// chunks.
func sseResponse(chunks ...string) func(ctx context.Context, req *extprocclient.Message) (*extprocclient.Message, error) {
	return func(ctx context.Context, req *extprocclient.Message) (*extprocclient.Message, error) {
		m := &extprocclient.Message{Headers: extprocclient.Headers{
			{Key: ":status", Value: "200"},
			{Key: "content-type", Value: "text/event-stream"},
		}}
		for _, c := range chunks {
			m.Body = append(m.Body, []byte(c))
		}
		return m, nil
	}
}

func get(h extprocclient.Headers, k string) string {
	v, _ := h.Get(k)
	return v
}
