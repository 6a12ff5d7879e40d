package loadbench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/tokenizer"
)

// The parts of a decision (issue 26 item 4): tokenizing, timed around the
// global router's tokenizer (timedTokenizer); the messages to the local
// routers, counted on the wire by a gRPC client interceptor (rtCounter);
// and the gRPC floor, a bare round trip of a probe's size on the same
// transport in the same process (floor.go's service).

// loadDecisionTokenizer is the tokenizer the benchmarks' global routers
// use: the default one (globalrouter.DefaultTokenizer), loaded once.
func loadDecisionTokenizer() (globalrouter.Tokenizer, error) {
	cfg := globalrouter.DefaultTokenizer
	cfg.Logger = slog.New(slog.DiscardHandler)
	t, err := tokenizer.Load(cfg)
	if err != nil {
		return nil, fmt.Errorf("decision bench: tokenizer: %w", err)
	}
	return t, nil
}

// timedTokenizer records how long each encoding takes.
type timedTokenizer struct {
	t   globalrouter.Tokenizer
	mu  sync.Mutex
	lat []time.Duration
}

func (t *timedTokenizer) record(t0 time.Time) {
	el := time.Since(t0)
	t.mu.Lock()
	t.lat = append(t.lat, el)
	t.mu.Unlock()
}

func (t *timedTokenizer) Encode(text string) ([]uint32, error) {
	defer t.record(time.Now())
	return t.t.Encode(text)
}

func (t *timedTokenizer) EncodeChat(req *tokenizer.ChatRequest) ([]uint32, error) {
	defer t.record(time.Now())
	return t.t.EncodeChat(req)
}

func (t *timedTokenizer) take() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.lat
	t.lat = nil
	return out
}

// rtCounter counts the messages the global router sends its local
// routers, by kind (a Channel message's oneof: probe, commit, event,
// cancel, and whatever kinds later versions add; "unary" for a unary
// call, "stream" for another stream's message), and, between begin and
// end (one decision at a time: the sequential phase), the decision's
// round trips: the longest chain of messages each sent after the answer
// to the one before arrived, counting only answers that arrived before
// the decision returned (what it waited for). A message still unanswered
// when the decision returns was not waited for (a pipelined commit).
type rtCounter struct {
	mu         sync.Mutex
	sent       map[string]int64
	probeBytes int
	// The decision in progress.
	active   bool
	answered int           // the deepest answered message's depth
	pending  map[rtKey]int // sent, unanswered: depth
	rounds   []int         // per decision: round trips waited for
	unwaited []int         // per decision: messages not waited for
}

type rtKey struct {
	s  *countedStream
	id uint64
}

func newRTCounter() *rtCounter {
	return &rtCounter{sent: map[string]int64{}, pending: map[rtKey]int{}}
}

func (c *rtCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainStreamInterceptor(c.stream), grpc.WithChainUnaryInterceptor(c.unary)}
}

func (c *rtCounter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &countedStream{ClientStream: cs, c: c}, nil
}

func (c *rtCounter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.sent["unary"]++
	depth := c.answered + 1
	c.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.mu.Lock()
	if c.active {
		c.answered = max(c.answered, depth)
	}
	c.mu.Unlock()
	return err
}

// begin starts counting a decision's round trips; end ends it.
func (c *rtCounter) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active, c.answered = true, 0
	clear(c.pending)
}

func (c *rtCounter) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active = false
	c.rounds = append(c.rounds, c.answered)
	c.unwaited = append(c.unwaited, len(c.pending))
	clear(c.pending)
}

// takeSeq returns the round trips and the messages not waited for of the
// decisions since the last take; takeSent the messages sent by kind.
func (c *rtCounter) takeSeq() (rounds, unwaited []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rounds, unwaited = c.rounds, c.unwaited
	c.rounds, c.unwaited = nil, nil
	return rounds, unwaited
}

func (c *rtCounter) takeSent() (map[string]int64, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.sent
	c.sent = map[string]int64{}
	return out, c.probeBytes
}

// probeSize is the largest probe sent so far, in bytes.
func (c *rtCounter) probeSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.probeBytes
}

// countedStream is a client stream whose messages rtCounter counts.
type countedStream struct {
	grpc.ClientStream
	c *rtCounter
}

func (s *countedStream) SendMsg(m any) error {
	c := s.c
	c.mu.Lock()
	if r, ok := m.(*localrouterv1.ChannelRequest); ok {
		kind := strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", r.GetMsg()), "*localrouterv1.ChannelRequest_"))
		c.sent[kind]++
		if r.GetProbe() != nil {
			c.probeBytes = max(c.probeBytes, proto.Size(r))
		}
		if c.active {
			c.pending[rtKey{s, r.GetId()}] = c.answered + 1 // registered before it leaves: its answer may come first
		}
	} else {
		c.sent["stream"]++
	}
	c.mu.Unlock()
	return s.ClientStream.SendMsg(m)
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*localrouterv1.ChannelResponse); ok && err == nil {
		c := s.c
		c.mu.Lock()
		k := rtKey{s, r.GetId()}
		if d, ok := c.pending[k]; ok && c.active {
			c.answered = max(c.answered, d)
			delete(c.pending, k)
		}
		c.mu.Unlock()
	}
	return err
}

// floorServer is the gRPC floor served beside the local routers, with
// their server options (server.TransportOptions), and a client on the
// pools' dial options: one stream, opened on the first measure with that
// measure's payload.
type floorServer struct {
	g      *grpc.Server
	conn   *grpc.ClientConn
	client *floorClient
}

func startFloor() (*floorServer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(server.TransportOptions()...)
	testgrpc.RegisterBenchmarkServiceServer(g, floorService{})
	go func() { _ = g.Serve(lis) }()
	// pool.GRPCDialer's static windows, as the probes' connections have.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<20))
	if err != nil {
		g.Stop()
		return nil, err
	}
	return &floorServer{g: g, conn: conn}, nil
}

// measure runs n sequential round trips of payload bytes (the first
// measure's payload: the stream is opened then, and warmed).
func (f *floorServer) measure(ctx context.Context, n, payload int) ([]time.Duration, error) {
	if f.client == nil {
		fc, err := newFloorClient(context.Background(), f.conn, payload)
		if err != nil {
			return nil, err
		}
		for range 16 { // the stream's first messages
			if err := fc.roundTrip(ctx); err != nil {
				fc.close()
				return nil, err
			}
		}
		f.client = fc
	}
	out := make([]time.Duration, n)
	for i := range out {
		t0 := time.Now()
		if err := f.client.roundTrip(ctx); err != nil {
			return nil, err
		}
		out[i] = time.Since(t0)
	}
	return out, nil
}

func (f *floorServer) stop() {
	if f.client != nil {
		f.client.close()
	}
	_ = f.conn.Close()
	f.g.Stop()
}

// LoadProbeConfig reads a YAML file holding a global router's probe
// section (`probe: {commit: ..., timeout: ...}`, the keys of
// globalrouter.ProbeConfig, strictly: an unknown key is an error naming
// it and its line): the benchmarks' routers run with it.
func LoadProbeConfig(path string) (globalrouter.ProbeConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return globalrouter.ProbeConfig{}, fmt.Errorf("probe config: %w", err)
	}
	return ParseProbeConfig(path, data)
}

// ParseProbeConfig is LoadProbeConfig of data read from file. The commit
// mode is checked by the global router's configuration validation.
func ParseProbeConfig(file string, data []byte) (globalrouter.ProbeConfig, error) {
	var out struct {
		Probe globalrouter.ProbeConfig `yaml:"probe"`
	}
	doc, err := config.ParseFile(file, data)
	if err != nil {
		return out.Probe, err
	}
	if len(doc.Content) == 0 {
		return out.Probe, fmt.Errorf("probe config %s: empty", file)
	}
	if err := config.DecodeStrict(file, "", doc.Content[0], &out); err != nil {
		return out.Probe, err
	}
	if out.Probe.Commit != "" {
		if err := CheckCommitMode(out.Probe.Commit); err != nil {
			return out.Probe, fmt.Errorf("probe config %s: %w", file, err)
		}
	}
	return out.Probe, nil
}

// LoadAverage is /proc/loadavg's first three fields ("?" elsewhere).
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
