// Package pooltest starts real local routers for tests: a localrouter.Router
// behind its gRPC service (localrouter/server) on a loopback listener, with a
// static worker directory standing in for etcd membership (the one seam it
// replaces). Tests of the global router and of kvgate's front door probe
// and commit against it over real gRPC.
package pooltest

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/membership"
)

// Worker is a pool member: its id and the HTTP address requests go to.
type Worker struct {
	ID      string
	Address string
}

// Workers returns n workers named prefix-0… with addresses 10.0.x.y:8000,
// x derived from prefix (so pools of different prefixes differ).
func Workers(prefix string, n int) []Worker {
	h := fnv.New32a()
	h.Write([]byte(prefix))
	out := make([]Worker, n)
	for i := range out {
		out[i] = Worker{ID: fmt.Sprintf("%s-%d", prefix, i), Address: fmt.Sprintf("10.0.%d.%d:8000", h.Sum32()%250, i+1)}
	}
	return out
}

// Server is one running local router.
type Server struct {
	Router *localrouter.Router
	// Addr is the gRPC address (127.0.0.1:port).
	Addr string

	grpc     *grpc.Server
	stopOnce sync.Once
	done     chan struct{}
	events   map[localrouter.WorkerKey]uint64
	mu       sync.Mutex
}

// Start starts a local router of blockSize with workers (approximate mode
// off: the index is fed with Store) on a free loopback port. It stops when
// the test ends.
func Start(t testing.TB, pool string, blockSize int, workers ...Worker) *Server {
	t.Helper()
	return StartOn(t, "127.0.0.1:0", pool, blockSize, workers...)
}

// StartOn is Start listening on addr (e.g. a stopped Server's, to bring a
// router back).
func StartOn(t testing.TB, addr, pool string, blockSize int, workers ...Worker) *Server {
	t.Helper()
	s, err := Serve(addr, pool, blockSize, workers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Serve is StartOn outside a test (benchmarks of kvgate bench): the caller
// stops the router with Close.
func Serve(addr, pool string, blockSize int, workers ...Worker) (*Server, error) {
	return serve(addr, pool, blockSize, nil, workers...)
}

// StartConfigured is Start with the router's configuration adjusted by
// configure (localrouter.DefaultConfig at blockSize before it).
func StartConfigured(t testing.TB, pool string, blockSize int, configure func(*localrouter.Config), workers ...Worker) *Server {
	t.Helper()
	s, err := serve("127.0.0.1:0", pool, blockSize, configure, workers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func serve(addr, pool string, blockSize int, configure func(*localrouter.Config), workers ...Worker) (*Server, error) {
	cfg := localrouter.DefaultConfig()
	cfg.BlockSize = blockSize
	if configure != nil {
		configure(&cfg)
	}
	r, err := localrouter.New(cfg, localrouter.Options{SweepInterval: -1})
	if err != nil {
		return nil, fmt.Errorf("localrouter.New: %w", err)
	}
	dir := directory{}
	for _, w := range workers {
		r.AddWorker(w.ID, 1)
		dir[w.ID] = membership.WorkerInfo{ID: w.ID, Address: w.Address, DPSize: 1, BlockSize: blockSize, Model: "*"}
	}
	srv, err := server.New(server.Options{Router: r, Directory: dir, Pool: pool, RouterID: pool + "-router"})
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("server.New: %w", err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	// The production transport (keepalive, fixed windows, stream workers):
	// benchmarks over these routers measure what a deployment runs.
	g := grpc.NewServer(server.TransportOptions()...)
	srv.Register(g)
	s := &Server{Router: r, Addr: lis.Addr().String(), grpc: g, done: make(chan struct{}), events: map[localrouter.WorkerKey]uint64{}}
	go func() {
		defer close(s.done)
		_ = g.Serve(lis)
	}()
	return s, nil
}

// Close stops serving and closes the router.
func (s *Server) Close() {
	s.Stop()
	_ = s.Router.Close()
}

// Stop stops serving at once (open streams break); idempotent.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.grpc.Stop()
		<-s.done
	})
}

// Store tells the router that worker caches the complete blocks of tokens
// (a KV Stored event, as the worker's engine would publish it).
func (s *Server) Store(t testing.TB, worker string, tokens []uint32) {
	t.Helper()
	bs := s.Router.Config().BlockSize
	s.mu.Lock()
	key := localrouter.WorkerKey{ID: worker}
	s.events[key]++
	id := s.events[key]
	s.mu.Unlock()
	var blocks []kvevents.Block
	for i := 0; i+bs <= len(tokens); i += bs {
		blocks = append(blocks, kvevents.Block{EngineHash: id<<32 | uint64(len(blocks)+1), TokenIDs: tokens[i : i+bs]})
	}
	if len(blocks) == 0 {
		return
	}
	ev := kvevents.RouterEvent{WorkerID: worker, EventID: id, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: blocks}}}
	if err := s.Router.ApplyEvent(ev); err != nil {
		t.Fatalf("store on %s: %v", worker, err)
	}
}

// ActiveRequests is the number of requests in flight on the router.
func (s *Server) ActiveRequests() int {
	n := 0
	s.Router.Active().Loads(func(_ localrouter.WorkerKey, l localrouter.WorkerLoad) { n += l.ActiveRequests })
	return n
}

// WaitIdle polls until the router has no request in flight or ctx ends.
func (s *Server) WaitIdle(ctx context.Context) error {
	for {
		if s.ActiveRequests() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d requests still active: %w", s.ActiveRequests(), ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// WaitActive polls until the router has n requests in flight or ctx ends
// (commits are pipelined: one may land just after Decide returned).
func (s *Server) WaitActive(ctx context.Context, n int) error {
	for {
		if s.ActiveRequests() == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d requests active, want %d: %w", s.ActiveRequests(), n, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// WaitNoReservations polls until the router holds no reservation
// (probe.commit: reserve; releases and confirmations are not waited for by
// the global router) or ctx ends.
func (s *Server) WaitNoReservations(ctx context.Context) error {
	for {
		if s.Router.ReservationStats().Held == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("reservations still held: %+v: %w", s.Router.ReservationStats(), ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// directory is the static worker directory (server.Directory).
type directory map[string]membership.WorkerInfo

func (d directory) Worker(id string) (membership.WorkerInfo, bool) { w, ok := d[id]; return w, ok }

func (d directory) Workers() []membership.WorkerInfo {
	out := make([]membership.WorkerInfo, 0, len(d))
	for _, w := range d {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
